#pragma once
// Prompt logprobs (GenerationRequest::num_prompt_logprobs) for one engine step: which token rows
// of the step score which prompt token, and the log_softmax of those rows as the Transformer
// hands their logits over, a group at a time (Transformer::ScoreFn). Host logic only.
//
// Row p of a sequence (the token at position p) predicts the token at p + 1: prompt positions
// 0 .. n-2 are scored, the last prompt position is the row that samples the first new token.
// Logprobs are those of the raw model distribution, as for sampled tokens (server/engine/sampling.hpp).
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "server/engine/sampling.hpp"

namespace fp8serve {

class PromptScorer {
 public:
  // Where one row's result goes: (*out)[position] for the prompt token at position + 1.
  struct Target {
    std::vector<SampleResult>* out = nullptr;
    int position = 0;
    int32_t token = 0;  // the prompt token at position + 1
    int num_top = 0;    // top logprobs wanted
  };

  void clear();
  // Token row `row` of the step (an index into ForwardBatch::token_ids) is scored into `target`.
  void add(int32_t row, const Target& target);
  bool empty() const { return rows_.empty(); }
  std::span<const int32_t> rows() const { return rows_; }  // ForwardBatch::score_rows

  // The ScoreFn: rows [first, first + num_rows) of rows(), their logits [num_rows, vocab].
  // Rows are independent: with a pool they are scored in parallel.
  void score(int64_t first, int64_t num_rows, std::span<const float> logits, cpu::ThreadPool* pool);

 private:
  std::vector<int32_t> rows_;
  std::vector<Target> targets_;  // [rows_.size()]
};

}  // namespace fp8serve
