#include "model/grammar/matcher.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <limits>

namespace fp8serve::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, bool allow_end_tokens)
    : grammar_(std::move(grammar)), allow_end_tokens_(allow_end_tokens), machine_(grammar_->grammar()) {
  machine_.set_committing(true);
  machine_.start(state_, grammar_->grammar().root, grammar_->grammar().rules[static_cast<size_t>(grammar_->grammar().root)].start,
                 kRootParent);
  machine_.set_committing(false);
}

bool GrammarMatcher::check_bytes(std::string_view bytes) {
  if (bytes.empty()) return false;
  const StackSet* cur = &state_;
  StackSet* next = &scratch_a_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    machine_.step(*cur, static_cast<uint8_t>(bytes[i]), *next);
    if (next->tops.empty()) return i + 1 == bytes.size() && next->can_end;
    cur = next;
    next = next == &scratch_a_ ? &scratch_b_ : &scratch_a_;
  }
  return true;
}

bool GrammarMatcher::advance(std::string_view bytes) {
  if (bytes.empty() || ended_) return false;
  machine_.set_committing(true);
  StackSet cur = state_;
  StackSet next;
  bool ok = true;
  for (size_t i = 0; i < bytes.size() && ok; ++i) {
    machine_.step(cur, static_cast<uint8_t>(bytes[i]), next);
    ok = !next.tops.empty() || (i + 1 == bytes.size() && next.can_end);
    std::swap(cur, next);
  }
  machine_.set_committing(false);
  if (ok) state_ = std::move(cur);
  return ok;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) { return advance(bytes); }

bool GrammarMatcher::accept_token(int32_t id) {
  const TokenVocabulary& vocab = grammar_->vocab();
  if (ended_) return false;
  if (vocab.is_end_token(id)) {
    if (!allow_end_tokens_ || !state_.can_end) return false;
    ended_ = true;
    return true;
  }
  if (!vocab.usable(id)) return false;
  std::string_view bytes = vocab.bytes(id);
  if (first_token_) {
    for (const auto& [variant_id, variant] : vocab.first_token_variants())
      if (variant_id == id) bytes = variant;
  }
  if (!advance(bytes)) return false;
  first_token_ = false;
  return true;
}

void GrammarMatcher::fill_next_token_bitmask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  if (ended_) return;
  const size_t pool_mark = machine_.mark();
  candidates_.clear();
  for (const Frame& top : state_.tops) {
    const std::shared_ptr<const StateMasks> masks = grammar_->state_masks(top.rule, top.state);
    if (masks->plain_slice) {
      const std::vector<uint64_t>& slice = grammar_->vocab().plain_slice();
      for (size_t w = 0; w < mask.size() && w < slice.size(); ++w) mask[w] |= slice[w];
    }
    if (!masks->accepted_bits.empty()) {
      for (size_t w = 0; w < mask.size() && w < masks->accepted_bits.size(); ++w) mask[w] |= masks->accepted_bits[w];
    } else {
      for (const int32_t id : masks->accepted_ids) bitmask_set(mask, id);
    }
    candidates_.insert(candidates_.end(), masks->uncertain.begin(), masks->uncertain.end());
  }
  const TokenVocabulary& vocab = grammar_->vocab();
  for (const int32_t id : candidates_)
    if (!bitmask_test(mask, id) && check_bytes(vocab.bytes(id))) bitmask_set(mask, id);
  if (first_token_) {
    // SentencePiece's first piece loses its leading space: those tokens write other bytes.
    for (const auto& [id, bytes] : vocab.first_token_variants()) {
      mask[static_cast<size_t>(id) >> 6] &= ~(1ull << (id & 63));
      if (check_bytes(bytes)) bitmask_set(mask, id);
    }
  }
  if (allow_end_tokens_ && state_.can_end)
    for (const int32_t id : vocab.end_tokens()) bitmask_set(mask, id);
  machine_.truncate(pool_mark);
}

int64_t GrammarMatcher::bytes_to_end(const StackSet& set) const {
  if (set.can_end) return 0;
  const Grammar& g = grammar_->grammar();
  int64_t best = INT64_MAX;
  for (const Frame& top : set.tops) {
    int64_t d = g.min_bytes[static_cast<size_t>(top.rule)][static_cast<size_t>(top.state)];
    for (int32_t p = top.parent; p >= 0;) {
      const Frame& f = machine_.node(p);
      d += g.min_bytes[static_cast<size_t>(f.rule)][static_cast<size_t>(f.state)];
      p = f.parent;
    }
    best = std::min(best, d);
  }
  return best;
}

int64_t GrammarMatcher::bytes_to_end() const { return ended_ ? 0 : bytes_to_end(state_); }

void GrammarMatcher::fill_closing_bitmask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  if (ended_) return;
  const TokenVocabulary& vocab = grammar_->vocab();
  if (state_.can_end) {
    if (allow_end_tokens_)
      for (const int32_t id : vocab.end_tokens()) bitmask_set(mask, id);
    return;
  }
  const int64_t now = bytes_to_end(state_);
  const size_t pool_mark = machine_.mark();
  for (int b = 0; b < 256; ++b) {
    const int32_t id = vocab.byte_token(static_cast<uint8_t>(b));
    if (id < 0) continue;
    machine_.step(state_, static_cast<uint8_t>(b), scratch_a_);
    if ((!scratch_a_.tops.empty() || scratch_a_.can_end) && bytes_to_end(scratch_a_) == now - 1) bitmask_set(mask, id);
  }
  machine_.truncate(pool_mark);
}

bool GrammarMatcher::can_finish_after(int32_t token, int64_t budget) {
  const TokenVocabulary& vocab = grammar_->vocab();
  if (vocab.is_end_token(token)) return true;
  if (!vocab.usable(token)) return false;
  const std::string_view bytes = vocab.bytes(token);
  const size_t pool_mark = machine_.mark();
  const StackSet* cur = &state_;
  StackSet* next = &scratch_a_;
  bool ok = true;
  for (size_t i = 0; i < bytes.size() && ok; ++i) {
    machine_.step(*cur, static_cast<uint8_t>(bytes[i]), *next);
    ok = !next->tops.empty() || (i + 1 == bytes.size() && next->can_end);
    cur = next;
    next = next == &scratch_a_ ? &scratch_b_ : &scratch_a_;
  }
  ok = ok && bytes_to_end(*cur) <= budget;
  machine_.truncate(pool_mark);
  return ok;
}

void apply_token_bitmask(std::span<const uint64_t> mask, std::span<float> logits) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = w < mask.size() ? mask[w] : 0;
    if (bits == ~0ull) continue;
    const size_t begin = w * 64, end = std::min(n, begin + 64);
    if (bits == 0) {  // the common case of a sparse mask: a whole word masked
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(begin), logits.begin() + static_cast<std::ptrdiff_t>(end), kNegInf);
      continue;
    }
    for (size_t i = begin; i < end; ++i) logits[i] = ((bits >> (i - begin)) & 1) ? logits[i] : kNegInf;  // branchless
  }
}

int64_t bitmask_count(std::span<const uint64_t> mask) {
  int64_t n = 0;
  for (const uint64_t w : mask) n += std::popcount(w);
  return n;
}

}  // namespace fp8serve::grammar
