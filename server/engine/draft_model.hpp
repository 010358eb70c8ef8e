#pragma once
// Draft-model speculation (--speculative-method draft, docs/speculative-decoding.md): a second,
// usually smaller model with the target's vocabulary proposes K tokens greedily; the target
// verifies them exactly as it verifies n-gram proposals (Engine::verify), so the output is the
// target's own whatever the draft proposes.
//
// The draft has its own Transformer on the target's backend, its own paged KV pool (the
// target's --kv-cache-dtype; FP8 scales calibrated on its own first prefill and frozen, as the
// target's are) and its own BlockManager (block tables; no prefix cache, no bf16 window: its
// KV only steers guesses), over the tokens it has fed (the target's, then its own guesses).
// Per speculating sequence:
//
//   propose()   roll the draft's cache back to the longest prefix of its tokens that the
//               target kept (its accepted proposals stay, rejected ones are truncated),
//               catch up on the tokens it has not seen (the prompt at first, then the target's
//               accepted and bonus tokens), then K - 1 greedy decode steps, batched over the
//               sequences: K proposals, each the argmax of its row.
//   release()   the sequence finished: its blocks go back to the draft's pool.
//
// A greedy draft is a point mass on its proposal, which is exactly the deterministic draft
// that Engine::verify's rule (server/engine/speculation.hpp) is exact for: sampled output keeps the
// target's distribution, and greedy or seeded output equals plain decoding's token for token.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_manager.hpp"
#include "cache/kv_cache_spec.hpp"
#include "config/config.hpp"
#include "kernels/backend.hpp"
#include "model/loader.hpp"
#include "model/transformer.hpp"
#include "server/engine/step_inputs.hpp"

namespace fp8serve {

struct DraftOptions {
  KvDtype kv_dtype = KvDtype::fp8_e4m3;
  KvRotation kv_rotation = KvRotation::none;  // the target's (--kv-rotation)
  float kv_scale_margin = kDefaultKvScaleMargin;
  int block_size = kDefaultBlockSize;
  int max_num_tokens = kDefaultMaxNumBatchedTokens;  // per catch-up chunk (--max-num-batched-tokens)
  // Sequences proposing in one step (--speculative-disable-by-batch-size).
  int max_num_seqs = kDefaultSpeculativeDisableByBatchSize;
  int max_model_len = 0;
};

// One sequence's request for proposals (Engine::propose_drafts).
struct DraftJob {
  SeqId id = 0;
  std::span<const int32_t> tokens;  // prompt + generated; the last one not computed by the target yet
  int max_tokens = 0;
  std::vector<int32_t>* out = nullptr;  // cleared first
  // The draft calibrates its FP8 scales on the prompt alone, as the target did, so that a model
  // drafting for itself rounds its KV as the target does.
  int num_prompt_tokens = 0;
};

class DraftModel {
 public:
  // Throws std::invalid_argument when the draft's vocabulary differs from the target's (size,
  // or the string of any token id): its token ids would mean other text.
  DraftModel(LoadedModel draft, const LoadedModel& target, Backend& backend, const DraftOptions& options);

  // The draft's part of a KV budget: so that both pools hold the same number of tokens,
  // budget x draft bytes per token / (draft + target bytes per token).
  uint64_t kv_share(uint64_t budget, uint64_t target_bytes_per_token) const;
  // Allocates the draft's pool from `bytes`; throws when they hold no block.
  void allocate_kv_cache(uint64_t bytes);

  void propose(std::span<DraftJob> jobs);
  void release(SeqId id);

  const BlockManager& block_manager() const { return *blocks_; }
  const KvCacheSpec& spec() const { return spec_; }
  const std::string& name() const { return name_; }
  uint64_t kv_cache_bytes() const { return transformer_->kv_cache_bytes(); }

 private:
  // Rolls `id` back to its prefix shared with `tokens` and appends the rest; false when the
  // pool cannot hold them (the sequence is then released: no proposals this step).
  bool catch_up(SeqId id, std::span<const int32_t> tokens, std::span<const SeqId> keep);
  // Frees draft sequences not in `keep` until `blocks` are free; false if that is not enough.
  bool make_room(int blocks, std::span<const SeqId> keep);
  // Runs the draft over each sequence's new tokens and puts the argmax of its last row into
  // `next`. catching_up: tokens [computed, num_tokens), in chunks of at most max_num_tokens,
  // then marked computed; else the one token a decode step appended (never marked computed).
  // calibrate_end (one sequence catching up): the first chunk ends there when it calibrates.
  void forward(std::span<const SeqId> ids, bool catching_up, std::vector<int32_t>& next, int calibrate_end = 0);
  int32_t argmax(std::span<const float> row) const;

  std::string name_;
  DraftOptions options_;
  ModelConfig config_;
  KvCacheSpec spec_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<BlockManager> blocks_;
  int32_t vocab_ = 0;  // the target's: proposals stay inside it
  std::unique_ptr<StepInputs> inputs_;  // over blocks_
  std::vector<float> logits_;
  std::vector<SeqId> held_;  // sequences with draft KV, oldest first
  // Per held sequence, the tokens whose slots blocks_ holds: the target's it has seen, then the
  // guesses it fed itself (kept while the target accepts them).
  std::unordered_map<SeqId, std::vector<int32_t>> fed_;
};

}  // namespace fp8serve
