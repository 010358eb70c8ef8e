#pragma once
// The engine loop's state and one step of it (DESIGN.md §2): the Transformer on its Backend,
// the BlockManager, the Scheduler, and per sequence a Sampler, an IncrementalDetokenizer and
// a StopChecker. Single-threaded: the HTTP server reaches it only through AsyncEngine
// (server/async_engine.hpp), the offline `generate` command drives it directly.
//
//   add_request(request, sink)   validate, queue (n > 1: one sequence per choice, forked
//                                from the prompt's blocks after prefill)
//   step()                       schedule -> copy-on-write -> forward -> calibrated scales ->
//                                sample -> stop checks -> outputs posted to each sink
//   abort(request_id)            frees the request's blocks now
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_manager.hpp"
#include "cache/kv_cache_spec.hpp"
#include "cache/kv_scales.hpp"
#include "config/config.hpp"
#include "kernels/backend.hpp"
#include "model/grammar/matcher.hpp"
#include "model/loader.hpp"
#include "model/tokenizer/detokenizer.hpp"
#include "model/transformer.hpp"
#include "server/api/engine_client.hpp"
#include "server/device.hpp"
#include "server/draft_model.hpp"
#include "server/engine_api.hpp"
#include "server/prompt_scoring.hpp"
#include "server/sampling.hpp"
#include "server/scheduler.hpp"
#include "server/speculation.hpp"
#include "server/stop_checker.hpp"

namespace fp8serve {

struct EngineOptions {
  std::string device = "cpu";  // auto | cpu | cuda (server/device.hpp); the CLI's default is auto
  KvDtype kv_dtype = KvDtype::fp8_e4m3;
  float kv_scale_margin = kDefaultKvScaleMargin;
  bool quantize_fp8 = false;           // --quantization fp8 (TransformerOptions)
  bool quantize_lm_head = false;       // with it, the LM head too (--fp8-lm-head)
  int kv_bf16_window = kDefaultKvBf16Window;  // --kv-bf16-window tokens (FP8 pool only; 0 = off)
  bool kv_bf16_window_values = false;  // --kv-bf16-window-tensors kv (true) or k (false)
  // --kv-bf16-window-share: the most of the KV budget the window's rings may take; as many rings
  // as fit are made, sequences beyond them run as pure FP8.
  double max_tail_share = kDefaultKvBf16WindowShare;
  int block_size = kDefaultBlockSize;
  // Bytes of K + V pool, the bf16 window's tail pool included; 0 = derive: on a GPU
  // gpu_memory_utilization of its memory minus what the weights and buffers took, on the CPU
  // kDefaultCpuKvCacheMemory.
  uint64_t kv_cache_memory = 0;
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  int max_model_len = 0;                  // 0 = the model's max_position_embeddings
  int max_num_seqs = kDefaultMaxNumSeqs;
  int max_num_batched_tokens = kDefaultMaxNumBatchedTokens;
  bool enable_prefix_caching = true;
  int threads = 0;                        // CPU threads, 0 = all cores
  bool enforce_eager = false;             // no CUDA graphs (decode steps replay them otherwise)
  bool lazy_graph_capture = false;        // capture decode graphs on first use, not at start-up
  bool device_sampling = true;            // off: the host samples every row (tests compare the two)
  // Speculative decoding (server/speculation.hpp): 0 = off; else ngram proposals of up to this
  // many tokens, verified in one pass (CPU only for now).
  int num_speculative_tokens = 0;
  NgramOptions ngram;
  // Non-empty: draft-model proposals from this model (server/draft_model.hpp) instead of ngram.
  std::string speculative_model;
  int speculative_disable_by_batch_size = kDefaultSpeculativeDisableByBatchSize;
};

constexpr uint64_t kDefaultCpuKvCacheMemory = 1ull << 30;

// The engine's part of the configuration (config/ validated it).
EngineOptions engine_options_from_config(const Config& config);

class Engine {
 public:
  // Uploads the weights to the backend and drops the host copy. Logs the start-up summary.
  Engine(LoadedModel model, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A request the engine cannot serve (empty prompt, a token id outside the vocabulary, too
  // long for --max-model-len or for the whole KV pool, n > --max-num-seqs, a duplicate id) is
  // answered at once through `sink` with finish = error and a message; never an exception.
  void add_request(GenerationRequest request, OutputSink sink);
  // Finishes every choice of the request with finish = abort; unknown ids are ignored.
  void abort(const std::string& request_id);
  // Aborts every request (shutdown).
  void abort_all();
  // One iteration: no-op when there is nothing to run.
  void step();
  bool has_work() const { return scheduler_->has_work(); }
  EngineStats stats() const;

  const ModelConfig& model_config() const { return transformer_->config(); }
  const Tokenizer& tokenizer() const { return *model_.tokenizer; }
  const LoadedModel& model() const { return model_; }  // weights already dropped
  const EngineOptions& options() const { return options_; }
  const BlockManager& block_manager() const { return *blocks_; }
  const KvSaturationCounters& saturation() const { return saturation_; }
  uint64_t kv_cache_bytes() const { return transformer_->kv_cache_bytes(); }  // the main pool
  uint64_t kv_tail_bytes() const { return transformer_->tail_bytes(); }       // the bf16 window's
  const Transformer& transformer() const { return *transformer_; }
  uint64_t weight_bytes() const { return transformer_->weight_bytes(); }
  int num_requests() const { return static_cast<int>(requests_.size()); }
  // The ids that end a sequence (the model's EOS): structured outputs allow them once complete.
  const std::vector<int32_t>& stop_token_ids() const { return stop_ids_; }
  // Time spent computing and applying token masks (structured outputs), and how many.
  double grammar_mask_seconds() const { return grammar_mask_seconds_; }
  // Budget checks of structured outputs (token-level shortest closing), summed over steps.
  double grammar_budget_seconds() const { return grammar_budget_seconds_; }
  int64_t grammar_mask_count() const { return grammar_mask_count_; }
  const SpecDecodeCounters& spec_decode() const { return spec_counters_; }
  const DraftModel* draft() const { return draft_.get(); }  // --speculative-method draft, else null

 private:
  struct RequestState {
    GenerationRequest request;
    OutputSink sink;
    std::vector<SeqId> seq_ids;  // per choice
    int num_unfinished = 0;
    double queue_s = -1;  // set when one of its sequences is first scheduled
    // Prompt logprobs (num_prompt_logprobs >= 0): [prompt tokens - 1], filled in prefill;
    // positions [0, num_scored) are done (a recompute after preemption skips them).
    std::vector<SampleResult> prompt_logprobs;
    int num_scored = 0;
  };
  struct SeqState {
    std::string request_id;
    int index = 0;
    Sampler sampler;
    IncrementalDetokenizer detokenizer;
    StopChecker stop_checker;
    int num_generated = 0;
    bool scheduled = false;  // has run in a step (its request's queue time is then known)
    std::unique_ptr<grammar::GrammarMatcher> matcher;  // structured output, else null
    bool prompt_logprobs_sent = false;  // with the choice's first output
    bool budget_free = false;  // no complete document fits in the budget: it cuts the text
    AcceptanceGate gate;       // speculative decoding: proposals pause while rarely accepted
  };
  // A speculating sequence's rows in the step's logits: row, row + 1, ... one per proposal + 1.
  struct Verify {
    SeqId id;
    std::size_t row;
    const std::vector<int32_t>* proposals;
  };

  void reject(const GenerationRequest& request, const OutputSink& sink, const std::string& message);
  std::string validate(const GenerationRequest& request) const;
  void run_step(const StepPlan& plan);
  // How the step's tokens are sampled: from the logits on the host (none), or on a backend that
  // samples: greedy picks, or the top-k prefilter's candidates (rows they cannot decide come back).
  enum class DeviceSampling : uint8_t { none, greedy, candidates };
  DeviceSampling device_sampling(const StepPlan& plan) const;
  void on_token(SeqId id, const SampleResult& sample);
  // Samples a speculating sequence's rows in order (sample_row: the token of one row of the
  // step, nullopt when the grammar ends the sequence), handing out each token, up to the first
  // one that differs from its proposal (server/speculation.hpp); the rest are rolled back.
  using VerifySampleFn = std::function<std::optional<SampleResult>(SeqId id, SeqState& seq, std::size_t row)>;
  void verify(const Verify& v, const VerifySampleFn& sample_row);
  // The proposals for the step's decoding sequences (Scheduler's BatchProposeFn): ngram, or the
  // draft model's, batched.
  void propose(std::span<ProposalRequest> requests);
  // The step's rows that score prompt tokens, into scorer_ (before the forward pass).
  void add_score_rows(const ScheduledSeq& s, int32_t first_row);
  // A request's prompt logprobs go out with each choice's first output.
  void attach_prompt_logprobs(SeqState& seq, RequestOutput& out);
  // A structured output's next token, sampled from row_ (a copy of `logits`) among those the
  // grammar allows and the token budget can still finish; the accepted token, or nullopt once
  // the sequence has finished (complete, or an error).
  std::optional<SampleResult> sample_structured(SeqId id, SeqState& seq, std::span<const float> logits);
  // The same for a row the device sampled after the grammar's mask joined its processing
  // (run_step): `sample`, the device's token (nullopt: its candidates could not decide), and
  // `row`, the step's row to download for what the host must sample itself.
  std::optional<SampleResult> sample_structured_on_device(SeqId id, SeqState& seq, std::optional<SampleResult> sample,
                                                          int64_t row);
  // The budget check that ends both: `sample` stands if the document can still end within the
  // budget after it, else it is sampled again (resample(mask): among the tokens of `mask`).
  std::optional<SampleResult> check_structured(SeqId id, SeqState& seq, SampleResult sample,
                                               const std::function<SampleResult(std::span<const uint64_t>)>& resample);
  std::nullopt_t fail_structured(SeqId id, const char* message);
  // The grammar's next-token bitmask into token_mask_ (timed for the metrics), applied to `row`
  // if given; false when no token can continue.
  bool fill_token_mask(SeqState& seq, std::span<float> row = {});
  int64_t token_budget(const SeqState& seq) const;  // tokens the sequence may still generate
  void finish_seq(SeqId id, RequestOutput& out, FinishReason reason);
  void fail_all(const std::string& message);

  LoadedModel model_;
  EngineOptions options_;
  Device device_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<DraftModel> draft_;
  KvSaturationCounters saturation_;
  std::vector<int32_t> stop_ids_;  // the model's EOS ids

  std::map<std::string, RequestState> requests_;
  std::unordered_map<SeqId, SeqState> seqs_;
  SeqId next_seq_id_ = 0;
  std::mt19937_64 seed_rng_;  // fallback seeds for requests without one

  // Step scratch, reused so a decode step allocates little.
  std::vector<int32_t> token_ids_, positions_, query_start_loc_, context_lens_, block_tables_;
  std::vector<int32_t> fp8_lens_, spill_starts_, tail_slots_;
  std::vector<int32_t> batch_index_;  // [plan.seqs]: the sequence's first row in the forward batch
  std::vector<BlockCopy> tail_copies_;
  std::vector<int32_t> sample_rows_;
  PromptScorer scorer_;
  std::vector<int64_t> slot_mapping_;
  std::vector<float> k_scales_, v_scales_, row_, inv_temperature_;
  LogitProcessingBatch processing_;  // device sampling: the step's logit processing (sampling.hpp)
  HostArray<float> logits_;  // the sampled rows' logits: pinned on a GPU, one DMA per step
  std::vector<uint64_t> token_mask_;
  std::vector<SeqId> dead_ends_;  // device sampling: structured outputs no token can continue
  double grammar_mask_seconds_ = 0;
  double grammar_budget_seconds_ = 0;
  int64_t grammar_mask_count_ = 0;
  std::vector<uint8_t> calibrate_;
  std::vector<KvWriteCounts> step_counts_;
  SpecDecodeCounters spec_counters_;
};

}  // namespace fp8serve
