// Structured outputs in the step (engine.hpp): the grammar's token mask, and the token budget
// within which the document must still be able to end (docs/structured-outputs.md).
#include <chrono>

#include "server/engine/engine.hpp"

namespace fp8serve {

std::nullopt_t Engine::fail_structured(SeqId id, const char* message) {
  RequestOutput out;
  out.error = message;
  finish_seq(id, out, FinishReason::error);
  return std::nullopt;
}

bool Engine::fill_token_mask(SeqState& seq, std::span<float> row) {
  grammar::GrammarMatcher& matcher = *seq.matcher;
  const auto t0 = std::chrono::steady_clock::now();
  token_mask_.resize(static_cast<size_t>(matcher.grammar().vocab().mask_words()));
  matcher.fill_next_token_bitmask(token_mask_);
  const bool any = grammar::bitmask_count(token_mask_) > 0;
  if (!row.empty()) grammar::apply_token_bitmask(token_mask_, row);
  grammar_mask_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++grammar_mask_count_;
  return any;
}

std::optional<SampleResult> Engine::sample_structured(SeqId id, SeqState& seq, std::span<const float> logits) {
  if (!fill_token_mask(seq, row_)) return fail_structured(id, kNoContinuation);
  return check_structured(id, seq, seq.sampler.sample(row_), [&](std::span<const uint64_t> mask) {
    row_.assign(logits.begin(), logits.end());
    grammar::apply_token_bitmask(mask, row_);
    return seq.sampler.sample(row_);
  });
}

std::optional<SampleResult> Engine::sample_structured_on_device(SeqId id, SeqState& seq, std::optional<SampleResult> sample,
                                                                int64_t row) {
  // The processed row (grammar mask and processors applied on the device), narrowed further by
  // `mask` (the budget's) if given, sampled without processing again.
  auto processed = [&](std::span<const uint64_t> mask) {
    logits_.resize(static_cast<std::size_t>(model_config().vocab_size));
    transformer_->download_logits_row(row, logits_.span());
    if (!mask.empty()) grammar::apply_token_bitmask(mask, logits_.span());
    return seq.sampler.sample_processed(logits_.span());
  };
  if (!sample) sample = processed({});  // the candidates could not decide
  return check_structured(id, seq, *sample, processed);
}

std::optional<SampleResult> Engine::check_structured(SeqId id, SeqState& seq, SampleResult sample,
                                                     const std::function<SampleResult(std::span<const uint64_t>)>& resample) {
  grammar::GrammarMatcher& matcher = *seq.matcher;
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t budget = tokens_left(seq);  // this token included
  if (!seq.budget_free && !matcher.fits_after(sample.token, budget - 1)) {
    // That token would leave more to write than the budget allows: sample again among the
    // tokens after which the document can still end in time (only its shortest ways once the
    // budget equals the fewest tokens left).
    token_mask_.resize(static_cast<size_t>(matcher.grammar().vocab().mask_words()));
    const bool settled = matcher.fill_budget_bitmask(token_mask_, budget - 1);
    if (grammar::bitmask_count(token_mask_) > 0) {
      seq.sampler.forget(sample.token);
      sample = resample(token_mask_);
    } else if (matcher.can_end()) {  // complete, and only the end token it may not write would fit
      RequestOutput out;
      finish_seq(id, out, FinishReason::stop);
      return std::nullopt;
    } else if (settled) {
      // No complete document fits in max_tokens: the model writes on, and the budget cuts the
      // text ("length"), as OpenAI does.
      seq.budget_free = true;
    }  // else no way is known within the search's work: the model's token stands
  }
  grammar_budget_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (!matcher.accept_token(sample.token))  // a masked token was sampled: a bug, not the client's doing
    return fail_structured(id, "structured output: the sampler chose a token the grammar does not allow");
  return sample;
}

int64_t Engine::tokens_left(const SeqState& seq) const {
  const GenerationRequest& r = requests_.at(seq.request_id).request;
  const int64_t by_length = static_cast<int64_t>(options_.max_model_len) - static_cast<int64_t>(r.prompt_tokens.size()) - seq.num_generated;
  return std::min<int64_t>(r.max_tokens - seq.num_generated, by_length);
}

}  // namespace fp8serve
