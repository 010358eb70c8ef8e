#pragma once
// Host-side sampling of the next token from one row of logits, with OpenAI/vLLM semantics.
//
// Order of processing (vLLM's): allowed_token_ids (every other token masked out), logit_bias
// (added), min_tokens (EOS and stop ids masked), repetition penalty (prompt + output tokens), frequency and presence penalties
// (output tokens), temperature, top-k, top-p, min-p, then a draw from the sequence's own RNG. temperature == 0 is greedy (ties go to the lowest id). Log-probabilities
// reported to the client are those of the raw model distribution (log_softmax of the logits as
// the model produced them), as vLLM reports by default.
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/sampling_ops.hpp"

namespace fp8serve {

struct SamplingParams {
  float temperature = 1.0f;      // 0 = greedy
  float top_p = 1.0f;            // (0, 1]
  int top_k = 0;                 // 0 = no limit
  float min_p = 0.0f;            // [0, 1]
  float presence_penalty = 0.0f;   // [-2, 2]
  float frequency_penalty = 0.0f;  // [-2, 2]
  float repetition_penalty = 1.0f; // > 0; 1 = off
  std::optional<uint64_t> seed;    // set: the draws are reproducible
  int num_logprobs = -1;           // -1: none; 0: the chosen token's; N: and the top N
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token, added to its logit), ids distinct
  std::vector<int32_t> allowed_token_ids;             // non-empty: sample only among these
  // vLLM's min_tokens: these ids (the engine fills in EOS and stop_token_ids) are masked out
  // while fewer than min_tokens tokens have been sampled.
  int min_tokens = 0;
  std::vector<int32_t> min_tokens_banned;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                   // of the chosen token (when num_logprobs >= 0)
  std::vector<TokenLogprob> top_logprobs; // the num_logprobs most likely, best first
  int rank = 0;                           // prompt logprobs: 1 + tokens with a higher logit
};

// One sequence's sampler: owns its RNG and the counts its penalties need.
class Sampler {
 public:
  // `fallback_seed` seeds the RNG when params.seed is unset (the engine draws it at random).
  Sampler(const SamplingParams& params, std::span<const int32_t> prompt_tokens, uint64_t fallback_seed);

  // Picks the next token from `logits` ([vocab_size], overwritten as scratch) and records it.
  // PRECOND: every id of params().logit_bias and allowed_token_ids is < vocab_size.
  SampleResult sample(std::span<float> logits);

  // Whether sample() would return the raw row's argmax and at most its logprob: greedy, with
  // no logit processor or penalty acting on this token and no top_logprobs. Such a token may be
  // picked where the logits are (Backend::sample_greedy) and handed to accept_greedy().
  bool greedy_on_raw_logits() const;
  // Records the device's pick for this sequence, as sample() would have. PRECOND: greedy_on_raw_logits().
  SampleResult accept_greedy(const GreedyRow& pick);

  // Whether a device's top-k prefilter of the raw row (Backend::sample_candidates) can stand in
  // for the row: no logit processor or penalty acts on it, and top_logprobs fit in K.
  bool candidates_suffice(int32_t num_candidates) const;
  // The token sample() would pick from the whole row, from its K best candidates (`ids`
  // ascending, `logits` theirs) and `row` (kernels/sampling_ops.hpp); the same draw, the same
  // logprobs. nullopt - nothing recorded, no random number used - when the candidates cannot
  // decide it (the nucleus or min-p's survivors reach past them, or a plain temperature draw
  // over the whole row): then sample_processed() the row. PRECOND: candidates_on_device(ids.size()).
  std::optional<SampleResult> sample_candidates(const CandidateRow& row, std::span<const int32_t> ids,
                                                std::span<const float> logits, int64_t vocab);

  // Whether this step's logit processors and penalties may run where the logits are
  // (Backend::process_logits, fed by logit_edits() and allow_mask()): some act, and no logprobs
  // are asked (those are of the raw row, which processing in place loses).
  bool processed_on_device() const;
  // Whether the device may pick this step's token: greedy_on_raw_logits(), or greedy on a row
  // processed there. And whether its candidates may stand in for the row, processed or raw.
  bool greedy_on_device() const;
  bool candidates_on_device(int32_t num_candidates) const;
  // This step's processing of the row as one edit per token (appended to `edits`), after the
  // allow mask (allowed_token_ids) when allow_mask() fills one: bit t set = token t kept. The
  // host applies the same edits (apply_logit_edit), so device and host compute the same bits.
  void logit_edits(std::vector<LogitEdit>& edits) const;
  bool allow_mask(std::span<uint32_t> words) const;  // false (words untouched): no mask
  // sample() of a row the device has already processed (processed_on_device() or nothing acted):
  // the draw and the record, no processing again. The row's logprobs, if asked, are its own.
  SampleResult sample_processed(std::span<float> logits);

  // Un-records a token sample() chose and the caller then refused (structured outputs' budget
  // check), so the penalties count only tokens really generated.
  void forget(int32_t token);

  const SamplingParams& params() const { return params_; }

 private:
  // allowed_token_ids, logit_bias, min_tokens, the penalties: the mask, then logit_edits()
  void apply_processors(std::span<float> logits);
  // The draw from a whole row (vocab == logits.size()), or from a prefilter's best candidates of
  // a longer one (ascending ids; row_scaled_sum its ExpSum of exp((l - max) / T)): the position
  // drawn, or nullopt - before any RNG use - when the candidates cannot decide it.
  std::optional<size_t> draw(std::span<const float> logits, int64_t vocab, const ExpSum* row_scaled_sum);
  bool processors_act() const;  // a logit processor or penalty changes this token's row
  void record(int32_t token);
  double uniform01();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> prompt_tokens_;                // distinct, for the repetition penalty
  std::unordered_map<int32_t, int32_t> output_counts_;  // token -> times generated
  int num_generated_ = 0;
  std::vector<int32_t> order_;                        // scratch: candidate ids
  std::vector<float> weights_;                        // scratch: exp((l - l_max) / T) per id
  std::vector<LogitEdit> edits_;                      // scratch: apply_processors()
  std::vector<uint32_t> mask_;                        // scratch: apply_processors()
};

// A step's logit processing for the device (Transformer::process_logits): row by row, each
// sampler's allow mask and edits, or nothing for a row without a sampler or without processing.
struct LogitProcessingBatch {
  std::vector<int32_t> mask_index;  // [rows] the row's mask in `masks`, or -1
  std::vector<uint32_t> masks;      // [*, mask_words]
  std::vector<int32_t> edit_begin;  // [rows + 1]
  std::vector<LogitEdit> edits;
  int64_t mask_words = 0;

  void clear(int64_t vocab_size);
  // nullptr: a row left as it is. `grammar`: a structured output's token bitmask (bit t of word
  // t / 64 set = token t may come next; tokens past it masked, as grammar::apply_token_bitmask),
  // ANDed into the row's mask: the host masks the row with it before sample(), the same bits.
  void add_row(const Sampler* sampler, std::span<const uint64_t> grammar = {});
  bool any() const { return !masks.empty() || !edits.empty(); }
};

// log_softmax of one row, for the reported logprobs: returns the log-probability of `token` and
// fills `top` with the `n` most likely tokens (ties: lower id first).
float raw_logprobs(std::span<const float> logits, int32_t token, int n, std::vector<TokenLogprob>& top);

}  // namespace fp8serve
