#include "server/grammar/nfa.hpp"

namespace fp8serve::grammar {

int32_t Nfa::add_state() {
  if (num_states_ >= max_states_)
    throw GrammarError("the grammar needs more than " + std::to_string(max_states_) +
                       " automaton states; simplify the schema (fewer or smaller counted repetitions, enums, patterns)");
  return num_states_++;
}

void Nfa::add_epsilon(int32_t from, int32_t to) { edges_.push_back({from, to, EdgeKind::epsilon, 0, 0, -1}); }

void Nfa::add_bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
  edges_.push_back({from, to, EdgeKind::bytes, lo, hi, -1});
}

void Nfa::add_call(int32_t from, RuleId rule, int32_t to) { edges_.push_back({from, to, EdgeKind::call, 0, 0, rule}); }

Frag Nfa::empty() {
  const int32_t s = add_state();
  return {s, s};
}

Frag Nfa::nothing() { return {add_state(), add_state()}; }

Frag Nfa::byte_range(uint8_t lo, uint8_t hi) {
  Frag f{add_state(), add_state()};
  add_bytes(f.in, lo, hi, f.out);
  return f;
}

Frag Nfa::literal(std::string_view bytes) {
  Frag f = empty();
  for (const char c : bytes) {
    const int32_t next = add_state();
    add_bytes(f.out, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
    f.out = next;
  }
  return f;
}

Frag Nfa::call(RuleId rule) {
  Frag f{add_state(), add_state()};
  add_call(f.in, rule, f.out);
  return f;
}

Frag Nfa::seq(std::initializer_list<Frag> parts) { return seq(std::vector<Frag>(parts)); }

Frag Nfa::seq(const std::vector<Frag>& parts) {
  if (parts.empty()) return empty();
  Frag f = parts.front();
  for (size_t i = 1; i < parts.size(); ++i) {
    add_epsilon(f.out, parts[i].in);
    f.out = parts[i].out;
  }
  return f;
}

Frag Nfa::alt(const std::vector<Frag>& choices) {
  if (choices.empty()) return nothing();
  if (choices.size() == 1) return choices.front();
  Frag f{add_state(), add_state()};
  for (const Frag& c : choices) {
    add_epsilon(f.in, c.in);
    add_epsilon(c.out, f.out);
  }
  return f;
}

Frag Nfa::optional(Frag inner) {
  Frag f{add_state(), add_state()};
  add_epsilon(f.in, inner.in);
  add_epsilon(inner.out, f.out);
  add_epsilon(f.in, f.out);
  return f;
}

Frag Nfa::star(Frag inner) {
  // A fresh hub state: the loop never re-enters the outside through the fragment's own entry.
  const int32_t hub = add_state();
  add_epsilon(hub, inner.in);
  add_epsilon(inner.out, hub);
  return {hub, hub};
}

Frag Nfa::plus(Frag inner) {
  Frag f{add_state(), add_state()};
  add_epsilon(f.in, inner.in);
  add_epsilon(inner.out, f.out);
  add_epsilon(inner.out, inner.in);
  return f;
}

Frag Nfa::repeat(const std::function<Frag()>& make, int min, int max) {
  std::vector<Frag> parts;
  for (int i = 0; i < min; ++i) parts.push_back(make());
  if (max < 0) {
    parts.push_back(star(make()));
  } else {
    // The optional tail nests, (x(x(x)?)?)?, so each extra copy is one optional step.
    Frag tail = empty();
    for (int i = min; i < max; ++i) tail = optional(seq({make(), tail}));
    parts.push_back(tail);
  }
  return seq(parts);
}

}  // namespace fp8serve::grammar
