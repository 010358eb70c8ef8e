#pragma once
// A grammar: rules, each a byte DFA with call edges (a pushdown automaton whose stack holds
// return points). Built by GrammarBuilder from NFA fragments, then analysed once:
//   - every rule reachable from the root is determinized within the state budget;
//   - rules whose language is empty are found (an unsatisfiable schema) and cut away, and
//     every state is trimmed to those that can still complete, so a matcher never walks into
//     a dead end;
//   - left recursion (a rule that can re-enter itself before consuming a byte) is refused,
//     so the matcher's closure always terminates;
//   - FOLLOW sets: the bytes that may come right after each rule ends, which the token-mask
//     cache uses to decide which tokens that leave a rule need a look at the stack.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "server/grammar/dfa.hpp"
#include "server/grammar/nfa.hpp"

namespace fp8serve::grammar {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void set(uint8_t b) { bits[b >> 6] |= 1ull << (b & 63); }
  bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool merge(const ByteSet& o) {  // returns whether anything was added
    bool changed = false;
    for (size_t i = 0; i < 4; ++i) {
      const uint64_t before = bits[i];
      bits[i] |= o.bits[i];
      changed |= bits[i] != before;
    }
    return changed;
  }
};

struct GrammarLimits {
  int64_t max_nfa_states = 400'000;
  int64_t max_dfa_states = 100'000;  // summed over all rules
  int max_rules = 4'096;
};

struct Grammar {
  std::vector<Dfa> rules;         // indexed by RuleId; unreachable or empty rules have no states
  std::vector<std::string> names;
  RuleId root = 0;
  std::vector<ByteSet> follow;    // [rule]: bytes that may follow the rule's end
  // [rule][state]: the fewest bytes that take the rule from the state to its end (callees
  // included). With the stack, the fewest bytes that finish the whole text.
  std::vector<std::vector<int32_t>> min_bytes;
  int64_t total_states() const;
};

// Fills g.min_bytes for `rules` (those reachable from the root); build() calls it.
void compute_min_bytes(Grammar& g, const std::vector<RuleId>& rules);

class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarLimits& limits = {});
  Nfa& nfa() { return nfa_; }
  // A rule to call before its body exists (recursion); define it once.
  RuleId declare(std::string name);
  void define(RuleId rule, Frag body);
  bool defined(RuleId rule) const { return bodies_[static_cast<size_t>(rule)].in >= 0; }
  int num_rules() const { return static_cast<int>(bodies_.size()); }

  // Throws GrammarError: nothing matches the root (unsatisfiable), left recursion, or over a limit.
  Grammar build(RuleId root);

 private:
  GrammarLimits limits_;
  Nfa nfa_;
  std::vector<Frag> bodies_;
  std::vector<std::string> names_;
};

}  // namespace fp8serve::grammar
