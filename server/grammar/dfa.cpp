#include "server/grammar/dfa.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace fp8serve::grammar {

namespace {

struct SetHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 1469598103934665603ull;
    for (const int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace

NfaIndex::NfaIndex(const Nfa& nfa) : edges_(nfa.edges()), begin_(static_cast<size_t>(nfa.num_states()) + 1, 0) {
  std::stable_sort(edges_.begin(), edges_.end(), [](const Nfa::Edge& a, const Nfa::Edge& b) { return a.from < b.from; });
  for (const Nfa::Edge& e : edges_) ++begin_[static_cast<size_t>(e.from) + 1];
  for (size_t i = 1; i < begin_.size(); ++i) begin_[i] += begin_[i - 1];
}

// Epsilon closure of `set`, returned sorted and unique.
void Determinizer::close(std::vector<int32_t>& set) {
  std::vector<int32_t> stack(set.begin(), set.end());
  set.clear();
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    if (mark_[static_cast<size_t>(s)]) continue;
    mark_[static_cast<size_t>(s)] = 1;
    set.push_back(s);
    for (const Nfa::Edge& e : nfa_.out(s))
      if (e.kind == Nfa::EdgeKind::epsilon && !mark_[static_cast<size_t>(e.to)]) stack.push_back(e.to);
  }
  for (const int32_t s : set) mark_[static_cast<size_t>(s)] = 0;
  std::sort(set.begin(), set.end());
}

Dfa Determinizer::run(Frag rule, int64_t max_states) {
  // Byte classes from the byte edges of every state reachable from the rule's entry.
  std::vector<int32_t> reach{rule.in};
  seen_[static_cast<size_t>(rule.in)] = 1;
  std::array<uint8_t, 257> boundary{};
  boundary[0] = 1;
  for (size_t i = 0; i < reach.size(); ++i) {
    for (const Nfa::Edge& e : nfa_.out(reach[i])) {
      if (e.kind == Nfa::EdgeKind::bytes) {
        boundary[e.lo] = 1;
        boundary[static_cast<size_t>(e.hi) + 1] = 1;
      }
      if (!seen_[static_cast<size_t>(e.to)]) {
        seen_[static_cast<size_t>(e.to)] = 1;
        reach.push_back(e.to);
      }
    }
  }
  for (const int32_t s : reach) seen_[static_cast<size_t>(s)] = 0;
  Dfa dfa;
  int cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (boundary[static_cast<size_t>(b)]) ++cls;
    dfa.byte_class[static_cast<size_t>(b)] = static_cast<uint8_t>(cls);
  }
  dfa.num_classes = cls + 1;

  std::unordered_map<std::vector<int32_t>, int32_t, SetHash> ids;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t>& set) -> int32_t {
    close(set);
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (static_cast<int64_t>(sets.size()) >= max_states)
      throw GrammarError("the grammar needs more than " + std::to_string(max_states) +
                         " deterministic states; simplify the schema (its alternatives or patterns overlap heavily)");
    const auto id = static_cast<int32_t>(sets.size());
    ids.emplace(set, id);
    sets.push_back(set);
    return id;
  };

  std::vector<int32_t> start{rule.in};
  dfa.start = intern(start);
  std::vector<std::vector<int32_t>> by_class(static_cast<size_t>(dfa.num_classes));
  std::map<RuleId, std::vector<int32_t>> by_call;
  dfa.call_begin.push_back(0);
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& v : by_class) v.clear();
    by_call.clear();
    bool final_state = false;
    for (const int32_t s : sets[d]) {
      if (s == rule.out) final_state = true;
      for (const Nfa::Edge& e : nfa_.out(s)) {
        if (e.kind == Nfa::EdgeKind::bytes) {
          for (int c = dfa.byte_class[e.lo]; c <= dfa.byte_class[e.hi]; ++c) by_class[static_cast<size_t>(c)].push_back(e.to);
        } else if (e.kind == Nfa::EdgeKind::call) {
          by_call[e.rule].push_back(e.to);
        }
      }
    }
    dfa.is_final.push_back(final_state ? 1 : 0);
    uint8_t any_bytes = 0;
    for (auto& targets : by_class) {
      int32_t to = -1;
      if (!targets.empty()) {
        to = intern(targets);
        any_bytes = 1;
      }
      dfa.next.push_back(to);
    }
    dfa.has_bytes.push_back(any_bytes);
    for (auto& [callee, targets] : by_call) dfa.calls.push_back({callee, intern(targets)});
    dfa.call_begin.push_back(static_cast<int32_t>(dfa.calls.size()));
  }
  dfa.num_states = static_cast<int32_t>(sets.size());
  return dfa;
}

bool trim(Dfa& dfa, const std::vector<uint8_t>& callee_nonempty) {
  const auto n = static_cast<size_t>(dfa.num_states);
  const auto k = static_cast<size_t>(dfa.num_classes);
  auto call_ok = [&](const DfaCall& c) {
    return c.rule >= 0 && static_cast<size_t>(c.rule) < callee_nonempty.size() && callee_nonempty[static_cast<size_t>(c.rule)];
  };
  // Reverse edges for co-reachability.
  std::vector<std::vector<int32_t>> preds(n);
  for (size_t s = 0; s < n; ++s) {
    for (size_t c = 0; c < k; ++c)
      if (const int32_t t = dfa.next[s * k + c]; t >= 0) preds[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    for (const DfaCall& call : dfa.calls_of(static_cast<int32_t>(s)))
      if (call_ok(call)) preds[static_cast<size_t>(call.target)].push_back(static_cast<int32_t>(s));
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> work;
  for (size_t s = 0; s < n; ++s)
    if (dfa.is_final[s]) {
      live[s] = 1;
      work.push_back(static_cast<int32_t>(s));
    }
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    for (const int32_t p : preds[static_cast<size_t>(s)])
      if (!live[static_cast<size_t>(p)]) {
        live[static_cast<size_t>(p)] = 1;
        work.push_back(p);
      }
  }
  if (n == 0 || !live[static_cast<size_t>(dfa.start)]) {
    dfa = Dfa{};
    return false;
  }
  // Forward reachability through live states only.
  std::vector<int32_t> remap(n, -1);
  std::vector<int32_t> order{dfa.start};
  remap[static_cast<size_t>(dfa.start)] = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto s = static_cast<size_t>(order[i]);
    auto visit = [&](int32_t t) {
      if (t >= 0 && live[static_cast<size_t>(t)] && remap[static_cast<size_t>(t)] < 0) {
        remap[static_cast<size_t>(t)] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    };
    for (size_t c = 0; c < k; ++c) visit(dfa.next[s * k + c]);
    for (const DfaCall& call : dfa.calls_of(static_cast<int32_t>(s)))
      if (call_ok(call)) visit(call.target);
  }
  Dfa out;
  out.num_states = static_cast<int32_t>(order.size());
  out.num_classes = dfa.num_classes;
  out.byte_class = dfa.byte_class;
  out.start = 0;
  out.call_begin.push_back(0);
  for (const int32_t old : order) {
    const auto s = static_cast<size_t>(old);
    uint8_t any_bytes = 0;
    for (size_t c = 0; c < k; ++c) {
      const int32_t t = dfa.next[s * k + c];
      const int32_t to = (t >= 0 && live[static_cast<size_t>(t)]) ? remap[static_cast<size_t>(t)] : -1;
      if (to >= 0) any_bytes = 1;
      out.next.push_back(to);
    }
    out.is_final.push_back(dfa.is_final[s]);
    out.has_bytes.push_back(any_bytes);
    for (const DfaCall& call : dfa.calls_of(old))
      if (call_ok(call) && live[static_cast<size_t>(call.target)]) out.calls.push_back({call.rule, remap[static_cast<size_t>(call.target)]});
    out.call_begin.push_back(static_cast<int32_t>(out.calls.size()));
  }
  dfa = std::move(out);
  return true;
}

}  // namespace fp8serve::grammar
