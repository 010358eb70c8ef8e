#include "server/grammar/grammar.hpp"

#include <algorithm>
#include <climits>
#include <functional>

namespace fp8serve::grammar {

namespace {

ByteSet bytes_of(const Dfa& dfa, int32_t state) {
  ByteSet out;
  if (!dfa.has_bytes[static_cast<size_t>(state)]) return out;
  for (int b = 0; b < 256; ++b)
    if (dfa.step(state, static_cast<uint8_t>(b)) >= 0) out.set(static_cast<uint8_t>(b));
  return out;
}

// States of `dfa` reachable from `from` without consuming a byte: through calls of nullable
// rules (the callee may end at once, and the matcher continues at the call's target).
std::vector<int32_t> null_closure(const Dfa& dfa, int32_t from, const std::vector<uint8_t>& nullable) {
  std::vector<int32_t> out{from};
  std::vector<uint8_t> seen(static_cast<size_t>(dfa.num_states), 0);
  seen[static_cast<size_t>(from)] = 1;
  for (size_t i = 0; i < out.size(); ++i)
    for (const DfaCall& c : dfa.calls_of(out[i]))
      if (nullable[static_cast<size_t>(c.rule)] && !seen[static_cast<size_t>(c.target)]) {
        seen[static_cast<size_t>(c.target)] = 1;
        out.push_back(c.target);
      }
  return out;
}

}  // namespace

int64_t Grammar::total_states() const {
  int64_t n = 0;
  for (const Dfa& d : rules) n += d.num_states;
  return n;
}

GrammarBuilder::GrammarBuilder(const GrammarLimits& limits) : limits_(limits), nfa_(limits.max_nfa_states) {}

RuleId GrammarBuilder::declare(std::string name) {
  if (static_cast<int>(bodies_.size()) >= limits_.max_rules)
    throw GrammarError("the grammar needs more than " + std::to_string(limits_.max_rules) + " rules; simplify the schema");
  bodies_.push_back(Frag{});
  names_.push_back(std::move(name));
  return static_cast<RuleId>(bodies_.size() - 1);
}

void GrammarBuilder::define(RuleId rule, Frag body) { bodies_[static_cast<size_t>(rule)] = body; }

Grammar GrammarBuilder::build(RuleId root) {
  const size_t n = bodies_.size();
  Grammar g;
  g.root = root;
  g.names = names_;
  g.rules.resize(n);
  const NfaIndex index(nfa_);
  Determinizer det(index);

  // Determinize the rules reachable from the root.
  std::vector<uint8_t> reachable(n, 0);
  std::vector<RuleId> order{root};
  reachable[static_cast<size_t>(root)] = 1;
  int64_t budget = limits_.max_dfa_states;
  for (size_t i = 0; i < order.size(); ++i) {
    const RuleId r = order[i];
    if (!defined(r)) throw GrammarError("rule '" + names_[static_cast<size_t>(r)] + "' is used but never defined");
    Dfa& dfa = g.rules[static_cast<size_t>(r)];
    dfa = det.run(bodies_[static_cast<size_t>(r)], budget);
    budget -= dfa.num_states;
    for (const DfaCall& c : dfa.calls)
      if (!reachable[static_cast<size_t>(c.rule)]) {
        reachable[static_cast<size_t>(c.rule)] = 1;
        order.push_back(c.rule);
      }
  }

  // Which rules match at least one string: a least fixpoint over "can finish, given callees".
  std::vector<uint8_t> nonempty(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (const RuleId r : order) {
      if (nonempty[static_cast<size_t>(r)]) continue;
      Dfa copy = g.rules[static_cast<size_t>(r)];
      if (trim(copy, nonempty)) {
        nonempty[static_cast<size_t>(r)] = 1;
        changed = true;
      }
    }
  }
  if (!nonempty[static_cast<size_t>(root)])
    throw GrammarError("no value satisfies the schema: its constraints contradict each other (or its $refs only lead to each other)");
  for (const RuleId r : order) trim(g.rules[static_cast<size_t>(r)], nonempty);

  // Rules still reachable after trimming (calls into empty rules are gone).
  std::vector<uint8_t> live(n, 0);
  std::vector<RuleId> live_order{root};
  live[static_cast<size_t>(root)] = 1;
  for (size_t i = 0; i < live_order.size(); ++i)
    for (const DfaCall& c : g.rules[static_cast<size_t>(live_order[i])].calls)
      if (!live[static_cast<size_t>(c.rule)]) {
        live[static_cast<size_t>(c.rule)] = 1;
        live_order.push_back(c.rule);
      }
  for (size_t r = 0; r < n; ++r)
    if (!live[r]) g.rules[r] = Dfa{};

  // Nullable rules (a least fixpoint), then the left-call graph must be acyclic.
  std::vector<uint8_t> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (const RuleId r : live_order) {
      if (nullable[static_cast<size_t>(r)]) continue;
      const Dfa& dfa = g.rules[static_cast<size_t>(r)];
      for (const int32_t s : null_closure(dfa, dfa.start, nullable))
        if (dfa.is_final[static_cast<size_t>(s)]) {
          nullable[static_cast<size_t>(r)] = 1;
          changed = true;
          break;
        }
    }
  }
  // A loop through calls of nullable rules (a repetition of something that may be empty)
  // would let the matcher's closure spin without consuming a byte: refuse it here.
  for (const RuleId r : live_order) {
    const Dfa& dfa = g.rules[static_cast<size_t>(r)];
    std::vector<uint8_t> state_color(static_cast<size_t>(dfa.num_states), 0);
    std::function<void(int32_t)> walk = [&](int32_t s) {
      state_color[static_cast<size_t>(s)] = 1;
      for (const DfaCall& c : dfa.calls_of(s)) {
        if (!nullable[static_cast<size_t>(c.rule)]) continue;
        if (state_color[static_cast<size_t>(c.target)] == 1)
          throw GrammarError("rule '" + names_[static_cast<size_t>(r)] + "' repeats a part that may be empty");
        if (state_color[static_cast<size_t>(c.target)] == 0) walk(c.target);
      }
      state_color[static_cast<size_t>(s)] = 2;
    };
    for (int32_t s = 0; s < dfa.num_states; ++s)
      if (state_color[static_cast<size_t>(s)] == 0) walk(s);
  }
  std::vector<std::vector<RuleId>> left_calls(n);
  for (const RuleId r : live_order) {
    const Dfa& dfa = g.rules[static_cast<size_t>(r)];
    for (const int32_t s : null_closure(dfa, dfa.start, nullable))
      for (const DfaCall& c : dfa.calls_of(s)) left_calls[static_cast<size_t>(r)].push_back(c.rule);
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the DFS path, 2 done
  std::function<void(RuleId)> visit = [&](RuleId r) {
    color[static_cast<size_t>(r)] = 1;
    for (const RuleId c : left_calls[static_cast<size_t>(r)]) {
      if (color[static_cast<size_t>(c)] == 1)
        throw GrammarError("'$ref': the schema refers to itself before any value is written ('" + names_[static_cast<size_t>(c)] +
                               "' can contain itself with nothing in front), which describes no finite JSON value",
                           "$ref");
      if (color[static_cast<size_t>(c)] == 0) visit(c);
    }
    color[static_cast<size_t>(r)] = 2;
  };
  for (const RuleId r : live_order)
    if (color[static_cast<size_t>(r)] == 0) visit(r);

  // FIRST sets of rules, then FOLLOW sets: for a call (R -> target) in rule P, FOLLOW(R) gets
  // the first bytes at target, and FOLLOW(P) too when P may end right after the call.
  std::vector<ByteSet> first(n);
  for (bool changed = true; changed;) {
    changed = false;
    for (const RuleId r : live_order) {
      const Dfa& dfa = g.rules[static_cast<size_t>(r)];
      for (const int32_t s : null_closure(dfa, dfa.start, nullable)) {
        changed |= first[static_cast<size_t>(r)].merge(bytes_of(dfa, s));
        for (const DfaCall& c : dfa.calls_of(s)) changed |= first[static_cast<size_t>(r)].merge(first[static_cast<size_t>(c.rule)]);
      }
    }
  }
  struct FollowEdge {
    RuleId callee, caller;
    ByteSet bytes;
    bool caller_may_end;
  };
  std::vector<FollowEdge> follow_edges;
  for (const RuleId r : live_order) {
    const Dfa& dfa = g.rules[static_cast<size_t>(r)];
    for (int32_t s = 0; s < dfa.num_states; ++s)
      for (const DfaCall& c : dfa.calls_of(s)) {
        FollowEdge e{c.rule, r, {}, false};
        for (const int32_t t : null_closure(dfa, c.target, nullable)) {
          e.bytes.merge(bytes_of(dfa, t));
          for (const DfaCall& inner : dfa.calls_of(t)) e.bytes.merge(first[static_cast<size_t>(inner.rule)]);
          if (dfa.is_final[static_cast<size_t>(t)]) e.caller_may_end = true;
        }
        follow_edges.push_back(e);
      }
  }
  g.follow.assign(n, ByteSet{});
  for (bool changed = true; changed;) {
    changed = false;
    for (const FollowEdge& e : follow_edges) {
      changed |= g.follow[static_cast<size_t>(e.callee)].merge(e.bytes);
      if (e.caller_may_end) {
        const ByteSet caller = g.follow[static_cast<size_t>(e.caller)];
        changed |= g.follow[static_cast<size_t>(e.callee)].merge(caller);
      }
    }
  }
  compute_min_bytes(g, live_order);
  return g;
}

void compute_min_bytes(Grammar& g, const std::vector<RuleId>& rules) {
  constexpr int32_t kInf = INT32_MAX / 4;
  g.min_bytes.assign(g.rules.size(), {});
  for (const RuleId r : rules) g.min_bytes[static_cast<size_t>(r)].assign(static_cast<size_t>(g.rules[static_cast<size_t>(r)].num_states), kInf);
  auto rule_min = [&](RuleId r) {
    const Dfa& d = g.rules[static_cast<size_t>(r)];
    return d.num_states > 0 ? g.min_bytes[static_cast<size_t>(r)][static_cast<size_t>(d.start)] : kInf;
  };
  // Bellman-Ford over all rules at once; states are numbered breadth-first from the start, so
  // relaxing them in reverse settles most of a chain in one pass.
  for (bool changed = true; changed;) {
    changed = false;
    for (const RuleId r : rules) {
      const Dfa& d = g.rules[static_cast<size_t>(r)];
      std::vector<int32_t>& m = g.min_bytes[static_cast<size_t>(r)];
      for (int32_t s = d.num_states - 1; s >= 0; --s) {
        int32_t best = d.is_final[static_cast<size_t>(s)] ? 0 : kInf;
        for (int32_t c = 0; c < d.num_classes; ++c) {
          const int32_t t = d.next[static_cast<size_t>(s) * static_cast<size_t>(d.num_classes) + static_cast<size_t>(c)];
          if (t >= 0) best = std::min(best, 1 + m[static_cast<size_t>(t)]);
        }
        for (const DfaCall& call : d.calls_of(s)) best = std::min(best, rule_min(call.rule) + m[static_cast<size_t>(call.target)]);
        best = std::min(best, kInf);
        if (best < m[static_cast<size_t>(s)]) {
          m[static_cast<size_t>(s)] = best;
          changed = true;
        }
      }
    }
  }
}

}  // namespace fp8serve::grammar
