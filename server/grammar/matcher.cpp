#include "server/grammar/matcher.hpp"

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

const StackSet* GrammarMatcher::run_bytes(std::string_view bytes) {
  if (bytes.empty()) return nullptr;
  const StackSet* cur = &state_;
  StackSet* next = &scratch_a_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    machine_.step(*cur, static_cast<uint8_t>(bytes[i]), *next);
    if (next->tops.empty()) return i + 1 == bytes.size() && next->can_end ? next : nullptr;
    cur = next;
    next = next == &scratch_a_ ? &scratch_b_ : &scratch_a_;
  }
  return cur;
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

std::string_view GrammarMatcher::token_bytes(int32_t id) const {
  const TokenVocabulary& vocab = grammar_->vocab();
  if (first_token_) {
    for (const auto& [variant_id, variant] : vocab.first_token_variants())
      if (variant_id == id) return variant;
  }
  return vocab.bytes(id);
}

bool GrammarMatcher::accept_token(int32_t id) {
  const TokenVocabulary& vocab = grammar_->vocab();
  if (ended_) return false;
  if (vocab.is_end_token(id)) {
    if (!allow_end_tokens_ || !state_.can_end) return false;
    ended_ = true;
    return true;
  }
  if (!vocab.usable(id)) return false;
  if (!advance(token_bytes(id))) return false;
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
    if (!bitmask_test(mask, id) && run_bytes(vocab.bytes(id))) bitmask_set(mask, id);
  if (first_token_) {
    // SentencePiece's first piece loses its leading space: those tokens write other bytes.
    for (const auto& [id, bytes] : vocab.first_token_variants()) {
      mask[static_cast<size_t>(id) >> 6] &= ~(1ull << (id & 63));
      if (run_bytes(bytes)) bitmask_set(mask, id);
    }
  }
  if (allow_end_tokens_ && state_.can_end)
    for (const int32_t id : vocab.end_tokens()) bitmask_set(mask, id);
  machine_.truncate(pool_mark);
}

int64_t GrammarMatcher::bytes_to_end(const StackSet& set) const { return set.can_end ? 0 : machine_.bytes_to_end(set.tops); }

int64_t GrammarMatcher::bytes_to_end() const { return ended_ ? 0 : bytes_to_end(state_); }

namespace {

int32_t clamp_budget(int64_t budget) { return static_cast<int32_t>(std::clamp<int64_t>(budget, -1, INT32_MAX / 4)); }

}  // namespace

int32_t GrammarMatcher::graph_frame(ClosingGraph& graph, int32_t pool_id) {
  if (graph_frames_.size() < machine_.pool_size()) graph_frames_.resize(machine_.pool_size(), -1);
  // The committed pool never changes below its top, so each frame is copied in once.
  std::vector<int32_t> chain;
  int32_t id = pool_id;
  while (id >= 0 && graph_frames_[static_cast<size_t>(id)] < 0) {
    chain.push_back(id);
    id = machine_.node(id).parent;
  }
  int32_t below = id < 0 ? id : graph_frames_[static_cast<size_t>(id)];
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Frame& f = machine_.node(*it);
    below = graph.intern(Frame{below, f.rule, f.state});
    graph_frames_[static_cast<size_t>(*it)] = below;
  }
  return below;
}

int32_t GrammarMatcher::graph_node(ClosingGraph& graph) {
  if (graph_generation_ != graph.generation()) {
    graph_frames_.clear();
    graph_generation_ = graph.generation();
  }
  std::vector<Frame> tops;
  tops.reserve(state_.tops.size());
  for (const Frame& f : state_.tops) tops.push_back(Frame{graph_frame(graph, f.parent), f.rule, f.state});
  return graph.node_of(std::move(tops), state_.can_end);
}

int64_t GrammarMatcher::tokens_to_end(int64_t limit) {
  if (ended_ || state_.can_end) return 0;
  ClosingGraph& graph = grammar_->closing_graph();
  const auto lock = graph.lock();
  return graph.distance(graph_node(graph), clamp_budget(limit));
}

bool GrammarMatcher::fits_after(int32_t token, int64_t budget) {
  const TokenVocabulary& vocab = grammar_->vocab();
  if (ended_) return false;
  if (vocab.is_end_token(token)) return allow_end_tokens_ && state_.can_end;
  if (!vocab.usable(token) || budget < 0) return false;
  const std::string_view bytes = token_bytes(token);
  ClosingGraph& graph = grammar_->closing_graph();
  if (graph.bytes_are_tokens()) {
    // The common case, a budget with room: the bytes still needed then fit one token each.
    const size_t pool_mark = machine_.mark();
    const StackSet* after = run_bytes(bytes);
    const bool roomy = after != nullptr && bytes_to_end(*after) <= budget;
    machine_.truncate(pool_mark);
    if (after == nullptr) return false;
    if (roomy) return true;
  }
  const auto lock = graph.lock();
  const int32_t to = graph.step(graph_node(graph), bytes);
  if (to < 0) return false;
  return graph.fits(to, clamp_budget(budget)) == ClosingGraph::Fit::yes;
}

bool GrammarMatcher::fill_budget_bitmask(std::span<uint64_t> mask, int64_t budget) {
  std::fill(mask.begin(), mask.end(), 0);
  if (ended_ || budget < 0) return true;
  const TokenVocabulary& vocab = grammar_->vocab();
  if (allow_end_tokens_ && state_.can_end)
    for (const int32_t id : vocab.end_tokens()) bitmask_set(mask, id);
  ClosingGraph& graph = grammar_->closing_graph();
  const auto lock = graph.lock();
  const int32_t now = graph_node(graph);
  const int32_t limit = clamp_budget(budget);
  bool settled = graph.fill_within(now, limit, mask);
  if (first_token_) {
    for (const auto& [id, bytes] : vocab.first_token_variants()) {
      mask[static_cast<size_t>(id) >> 6] &= ~(1ull << (id & 63));
      const int32_t to = graph.step(now, bytes);
      if (to < 0) continue;
      const ClosingGraph::Fit fit = graph.fits(to, limit);
      if (fit == ClosingGraph::Fit::yes) bitmask_set(mask, id);
      settled = settled && fit != ClosingGraph::Fit::unknown;
    }
  }
  return settled;
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
