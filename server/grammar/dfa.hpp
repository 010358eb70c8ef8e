#pragma once
// One rule of a grammar as a DFA over bytes, plus call edges: from a state the matcher may
// also enter another rule and, once that rule ends, continue at the call's target. Bytes are
// grouped into classes (intervals of byte values the rule never tells apart), so a transition
// is one table lookup: next[state * num_classes + byte_class[b]].
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "server/grammar/nfa.hpp"

namespace fp8serve::grammar {

struct DfaCall {
  RuleId rule;
  int32_t target;
};

struct Dfa {
  int32_t num_states = 0;
  int32_t num_classes = 1;
  int32_t start = 0;
  std::array<uint8_t, 256> byte_class{};
  std::vector<int32_t> next;          // [num_states * num_classes], -1: no transition
  std::vector<uint8_t> is_final;      // [num_states]: the rule may end here
  std::vector<uint8_t> has_bytes;     // [num_states]: some byte leads on
  std::vector<int32_t> call_begin;    // [num_states + 1] into calls
  std::vector<DfaCall> calls;

  int32_t step(int32_t state, uint8_t byte) const {
    return next[static_cast<size_t>(state) * static_cast<size_t>(num_classes) + byte_class[byte]];
  }
  std::span<const DfaCall> calls_of(int32_t state) const {
    return {calls.data() + call_begin[static_cast<size_t>(state)],
            static_cast<size_t>(call_begin[static_cast<size_t>(state) + 1] - call_begin[static_cast<size_t>(state)])};
  }
};

// Edges of an Nfa indexed by source state (built once per grammar).
class NfaIndex {
 public:
  explicit NfaIndex(const Nfa& nfa);
  int32_t num_states() const { return static_cast<int32_t>(begin_.size()) - 1; }
  std::span<const Nfa::Edge> out(int32_t state) const {
    return {edges_.data() + begin_[static_cast<size_t>(state)],
            static_cast<size_t>(begin_[static_cast<size_t>(state) + 1] - begin_[static_cast<size_t>(state)])};
  }

 private:
  std::vector<Nfa::Edge> edges_;
  std::vector<int32_t> begin_;
};

// Subset construction, one rule at a time, with scratch sized once for the whole NFA.
class Determinizer {
 public:
  explicit Determinizer(const NfaIndex& nfa)
      : nfa_(nfa), mark_(static_cast<size_t>(nfa.num_states()), 0), seen_(static_cast<size_t>(nfa.num_states()), 0) {}
  // The DFA of the fragment `rule` (accepting at rule.out). Throws GrammarError when it would
  // exceed `max_states` (the caller's budget left for this rule).
  Dfa run(Frag rule, int64_t max_states);

 private:
  void close(std::vector<int32_t>& set);

  const NfaIndex& nfa_;
  std::vector<uint8_t> mark_, seen_;
};

// Keeps the states that are reachable from the start and can reach a final state, counting a
// call edge only when `callee_nonempty[callee]`; other call edges are dropped. Returns false
// (and leaves the DFA empty) when the start itself cannot reach a final state.
bool trim(Dfa& dfa, const std::vector<uint8_t>& callee_nonempty);

}  // namespace fp8serve::grammar
