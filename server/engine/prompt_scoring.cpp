#include "server/engine/prompt_scoring.hpp"

#include <algorithm>
#include <stdexcept>

namespace fp8serve {

void PromptScorer::clear() {
  rows_.clear();
  targets_.clear();
}

void PromptScorer::add(int32_t row, const Target& target) {
  if (target.out == nullptr || target.position < 0 || static_cast<std::size_t>(target.position) >= target.out->size())
    throw std::logic_error("PromptScorer::add: a target outside its request's prompt logprobs");
  rows_.push_back(row);
  targets_.push_back(target);
}

void PromptScorer::score(int64_t first, int64_t num_rows, std::span<const float> logits, cpu::ThreadPool* pool) {
  if (num_rows <= 0) return;
  const std::size_t vocab = logits.size() / static_cast<std::size_t>(num_rows);
  auto score_row = [&](int64_t i) {
    const Target& t = targets_.at(static_cast<std::size_t>(first + i));
    SampleResult& r = (*t.out)[static_cast<std::size_t>(t.position)];
    r.token = t.token;
    const std::span<const float> row = logits.subspan(static_cast<std::size_t>(i) * vocab, vocab);
    r.logprob = raw_logprobs(row, t.token, t.num_top, r.top_logprobs);
    const float mine = row[static_cast<std::size_t>(t.token)];
    r.rank = 1 + static_cast<int>(std::count_if(row.begin(), row.end(), [mine](float l) { return l > mine; }));
  };
  if (pool != nullptr && num_rows > 1) {
    pool->parallel_for(num_rows, score_row);
  } else {
    for (int64_t i = 0; i < num_rows; ++i) score_row(i);
  }
}

}  // namespace fp8serve
