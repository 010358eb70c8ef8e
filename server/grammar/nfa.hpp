#pragma once
// A byte-level NFA under construction, shared by every rule of one grammar. Fragments are
// (entry, exit) state pairs wired together with epsilon edges (Thompson's construction); an
// edge either consumes one byte from a range or calls another rule (a pushdown call: the
// callee's whole language, then on to the edge's target). Rules are later determinized one by
// one (dfa.hpp).
//
//   Nfa nfa(limits.max_nfa_states);
//   Frag key = nfa.literal("\"name\"");
//   Frag value = nfa.seq({nfa.literal(":"), nfa.call(string_rule)});
//   Frag member = nfa.seq({key, value});
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve::grammar {

using RuleId = int32_t;

// A grammar (or schema) that cannot be compiled within the limits, or that is malformed.
// `keyword` names the JSON Schema keyword at fault when there is one (the API's 400 names it).
class GrammarError : public std::runtime_error {
 public:
  explicit GrammarError(const std::string& message, std::string keyword = {})
      : std::runtime_error(message), keyword_(std::move(keyword)) {}
  const std::string& keyword() const { return keyword_; }

 private:
  std::string keyword_;
};

struct Frag {
  int32_t in = -1;
  int32_t out = -1;
};

class Nfa {
 public:
  enum class EdgeKind : uint8_t { epsilon, bytes, call };
  struct Edge {
    int32_t from;
    int32_t to;
    EdgeKind kind;
    uint8_t lo, hi;  // bytes: the inclusive range
    RuleId rule;     // call: the callee
  };

  // Throws GrammarError once more than `max_states` states are asked for.
  explicit Nfa(int64_t max_states) : max_states_(max_states) {}

  int32_t add_state();
  void add_epsilon(int32_t from, int32_t to);
  void add_bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to);
  void add_call(int32_t from, RuleId rule, int32_t to);

  Frag empty();    // the empty string
  Frag nothing();  // no string at all (an unsatisfiable part; trimmed away later)
  Frag byte_range(uint8_t lo, uint8_t hi);
  Frag literal(std::string_view bytes);
  Frag call(RuleId rule);
  Frag seq(std::initializer_list<Frag> parts);
  Frag seq(const std::vector<Frag>& parts);
  Frag alt(const std::vector<Frag>& choices);
  Frag optional(Frag f);
  Frag star(Frag f);  // zero or more; f is used once (a loop), not copied
  Frag plus(Frag f);
  // Between min and max copies of what `make` builds (max < 0: unbounded). Each copy is a
  // fresh fragment, so `make` is called up to max (or min + 1) times.
  Frag repeat(const std::function<Frag()>& make, int min, int max);

  int32_t num_states() const { return num_states_; }
  const std::vector<Edge>& edges() const { return edges_; }

 private:
  int64_t max_states_;
  int32_t num_states_ = 0;
  std::vector<Edge> edges_;
};

}  // namespace fp8serve::grammar
