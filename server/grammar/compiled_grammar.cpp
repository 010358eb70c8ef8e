#include "server/grammar/compiled_grammar.hpp"

#include <algorithm>
#include <chrono>

#include "server/grammar/stack_machine.hpp"

namespace fp8serve::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), closing_graph_(grammar_, *vocab_) {
  cache_.resize(grammar_.rules.size());
  plain_capacity_.resize(grammar_.rules.size());
  for (size_t r = 0; r < grammar_.rules.size(); ++r) {
    cache_[r].resize(static_cast<size_t>(grammar_.rules[r].num_states));
    plain_capacity_[r].assign(static_cast<size_t>(grammar_.rules[r].num_states), -1);
  }
}

std::shared_ptr<const StateMasks> CompiledGrammar::state_masks(RuleId rule, int32_t state) const {
  std::lock_guard lock(mutex_);
  auto& slot = cache_[static_cast<size_t>(rule)][static_cast<size_t>(state)];
  if (slot) return slot;
  const auto t0 = std::chrono::steady_clock::now();
  auto masks = std::make_shared<const StateMasks>(classify(rule, state));
  stats_.classify_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.num_classified;
  if (stats_.cache_bytes + masks->bytes() > kMaxCacheBytes) {
    for (auto& states : cache_)
      for (auto& s : states) s.reset();
    stats_.cache_bytes = 0;
  }
  stats_.cache_bytes += masks->bytes();
  slot = masks;
  return masks;
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

namespace {

// One plain JSON-string character as UTF-8: (from, lo, hi, to) over the states of a small
// automaton, 0 the start and 1 the end.
struct PlainEdge {
  int from;
  uint8_t lo, hi;
  int to;
};
constexpr PlainEdge kPlainChar[] = {
    {0, 0x20, 0x21, 1}, {0, 0x23, 0x5B, 1}, {0, 0x5D, 0x7F, 1},  // ASCII but '"', '\\', controls
    {0, 0xC2, 0xDF, 2}, {0, 0xE0, 0xE0, 5}, {0, 0xE1, 0xEC, 3},  {0, 0xED, 0xED, 6}, {0, 0xEE, 0xEF, 3},
    {0, 0xF0, 0xF0, 7}, {0, 0xF1, 0xF3, 4}, {0, 0xF4, 0xF4, 8},  {4, 0x80, 0xBF, 3}, {3, 0x80, 0xBF, 2},
    {2, 0x80, 0xBF, 1}, {5, 0xA0, 0xBF, 2}, {6, 0x80, 0x9F, 2},  {7, 0x90, 0xBF, 3}, {8, 0x80, 0x8F, 3},
};

void merge_into(StackSet& into, const StackSet& from) {
  for (const Frame& f : from.tops)
    if (std::find(into.tops.begin(), into.tops.end(), f) == into.tops.end()) into.tops.push_back(f);
  into.can_end |= from.can_end;
}

}  // namespace

int CompiledGrammar::plain_capacity(RuleId rule, int32_t state) const {
  int8_t& memo = plain_capacity_[static_cast<size_t>(rule)][static_cast<size_t>(state)];
  if (memo >= 0) return memo;
  if (memo == -2) return kPlainSliceChars;  // a cycle: as many characters as wanted
  memo = -2;
  // The DFA states after exactly one plain character, through every byte of every way to write
  // one; any way that dies means capacity 0.
  const Dfa& dfa = grammar_.rules[static_cast<size_t>(rule)];
  std::vector<std::pair<int, int32_t>> work{{0, state}}, seen{{0, state}};
  std::vector<int32_t> after;
  bool ok = true;
  while (!work.empty() && ok) {
    const auto [p, q] = work.back();
    work.pop_back();
    for (const PlainEdge& e : kPlainChar) {
      if (e.from != p) continue;
      for (int b = e.lo; b <= e.hi && ok; ++b) {
        const int32_t next = dfa.step(q, static_cast<uint8_t>(b));
        if (next < 0) {
          ok = false;
        } else if (e.to == 1) {
          if (std::find(after.begin(), after.end(), next) == after.end()) after.push_back(next);
        } else if (std::find(seen.begin(), seen.end(), std::pair{e.to, next}) == seen.end()) {
          seen.emplace_back(e.to, next);
          work.emplace_back(e.to, next);
        }
      }
    }
  }
  int capacity = 0;
  if (ok) {
    capacity = kPlainSliceChars;
    for (const int32_t t : after) capacity = std::min(capacity, 1 + plain_capacity(rule, t));
  }
  memo = static_cast<int8_t>(capacity);
  return capacity;
}

StateMasks CompiledGrammar::classify(RuleId rule, int32_t state) const {
  const TokenVocabulary& vocab = *vocab_;
  // Where the state takes any run of plain characters, the plain slice is accepted whole and
  // only the other tokens are walked.
  const bool slice = plain_capacity(rule, state) >= kPlainSliceChars;
  const TokenTrie& walked = slice ? vocab.non_plain_trie() : vocab.trie();
  const std::vector<TrieNode>& trie = walked.nodes;
  const std::vector<int32_t>& sorted = walked.sorted;
  StackMachine machine(grammar_);

  // One level of context: when a path leaves the rule, it continues at every place the rule is
  // called from ("outer" stacks); only a path that also leaves those callers is left to the
  // run-time check, and only when its next byte may follow one of them.
  // `beyond`: bytes that may follow a caller once it ends; `beyond_now`: the same for the
  // callers that may end right after the call (e.g. the root, which then ends the text).
  StackSet callers, one;
  ByteSet beyond, beyond_now;
  for (size_t p = 0; p < grammar_.rules.size(); ++p) {
    const Dfa& dfa = grammar_.rules[p];
    for (const DfaCall& c : dfa.calls) {
      if (c.rule != rule) continue;
      machine.start(one, static_cast<RuleId>(p), c.target, kExitParent);
      merge_into(callers, one);
      beyond.merge(grammar_.follow[p]);
      if (one.can_end) beyond_now.merge(grammar_.follow[p]);
    }
  }

  const auto depth = static_cast<size_t>(vocab.max_token_bytes()) + 1;
  std::vector<StackSet> inner(depth), outer(depth);
  std::vector<uint8_t> leaves(depth, 0);  // a path left the callers too, with a byte that may follow them
  machine.start(inner[0], rule, state, kExitParent);
  StackSet scratch;

  std::vector<uint64_t> accepted(static_cast<size_t>(vocab.mask_words()), 0);
  std::vector<int32_t> accepted_ids, uncertain;
  auto accept = [&](int32_t from, int32_t to) {
    for (int32_t k = from; k < to; ++k) {
      const int32_t id = sorted[static_cast<size_t>(k)];
      accepted[static_cast<size_t>(id) >> 6] |= 1ull << (id & 63);
      accepted_ids.push_back(id);
    }
  };
  auto defer = [&](int32_t from, int32_t to) {
    for (int32_t k = from; k < to; ++k) uncertain.push_back(sorted[static_cast<size_t>(k)]);
  };

  size_t i = 0;
  while (i < trie.size()) {
    const TrieNode& node = trie[i];
    const size_t d = node.depth;
    const StackSet& in_prev = inner[d - 1];
    const StackSet& out_prev = outer[d - 1];
    machine.step(in_prev, node.byte, inner[d]);
    machine.step(out_prev, node.byte, outer[d]);
    if (in_prev.can_end && !callers.tops.empty()) {
      machine.step(callers, node.byte, scratch);
      merge_into(outer[d], scratch);
    }
    // Leaving the callers too: from an outer stack that may end, or straight from the rule when
    // a caller may end right after the call.
    const bool left = leaves[d - 1] || (out_prev.can_end && beyond.test(node.byte)) ||
                      (in_prev.can_end && callers.can_end && beyond_now.test(node.byte));
    leaves[d] = left;
    const StackSet& in = inner[d];
    const StackSet& out = outer[d];
    const bool inside = !in.tops.empty() || in.can_end;  // valid here whatever the stack holds
    if (inside) {
      accept(node.tok_first, node.own_end);
    } else if (left || !out.empty()) {
      defer(node.tok_first, node.own_end);
    }
    const bool goes_on = !in.tops.empty() || in.can_end || !out.tops.empty() || out.can_end;
    if (goes_on && (inside || !left)) {
      ++i;
    } else if (goes_on || left) {
      // No path stays inside the rule and one already left its callers: all below depends on
      // the stack.
      defer(node.own_end, node.tok_last);
      i = static_cast<size_t>(node.subtree_end);
    } else {
      i = static_cast<size_t>(node.subtree_end);
    }
  }

  StateMasks out;
  out.plain_slice = slice;
  out.uncertain = std::move(uncertain);
  if (accepted_ids.size() * 32 > static_cast<size_t>(vocab.mask_size())) {
    out.accepted_bits = std::move(accepted);
  } else {
    out.accepted_ids = std::move(accepted_ids);
  }
  return out;
}

}  // namespace fp8serve::grammar
