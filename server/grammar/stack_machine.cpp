#include "server/grammar/stack_machine.hpp"

#include <algorithm>
#include <climits>

namespace fp8serve::grammar {

int32_t StackMachine::push_return(int32_t parent, RuleId rule, int32_t state) {
  const Frame f{parent, rule, state};
  if (committing_) {
    auto [it, inserted] = interned_.try_emplace(f, static_cast<int32_t>(pool_.size()));
    if (inserted) pool_.push_back(f);
    return it->second;
  }
  pool_.push_back(f);
  return static_cast<int32_t>(pool_.size()) - 1;
}

void StackMachine::closure(std::span<const Frame> seeds, StackSet& out) {
  out.tops.clear();
  out.can_end = false;
  work_.assign(seeds.begin(), seeds.end());
  seen_.clear();
  while (!work_.empty()) {
    const Frame f = work_.back();
    work_.pop_back();
    // The grammar has no left recursion and no loop of empty calls (GrammarBuilder::build), so
    // the closure is finite; `seen_` only removes duplicate work.
    if (std::find(seen_.begin(), seen_.end(), f) != seen_.end()) continue;
    seen_.push_back(f);
    const Dfa& dfa = grammar_.rules[static_cast<size_t>(f.rule)];
    if (dfa.has_bytes[static_cast<size_t>(f.state)] && out.tops.size() < kMaxTops) out.tops.push_back(f);
    for (const DfaCall& c : dfa.calls_of(f.state)) {
      const int32_t ret = push_return(f.parent, f.rule, c.target);
      work_.push_back({ret, c.rule, grammar_.rules[static_cast<size_t>(c.rule)].start});
    }
    if (dfa.is_final[static_cast<size_t>(f.state)]) {
      if (f.parent < 0) {
        out.can_end = true;
      } else {
        work_.push_back(pool_[static_cast<size_t>(f.parent)]);
      }
    }
  }
}

void StackMachine::start(StackSet& out, RuleId rule, int32_t state, int32_t parent) {
  const Frame seed{parent, rule, state};
  closure(std::span<const Frame>(&seed, 1), out);
}

void StackMachine::step(const StackSet& in, uint8_t byte, StackSet& out) {
  // The common case, one stack moving inside its rule, needs no closure bookkeeping.
  if (in.tops.size() == 1) {
    const Frame& f = in.tops.front();
    const Dfa& dfa = grammar_.rules[static_cast<size_t>(f.rule)];
    const int32_t next = dfa.step(f.state, byte);
    if (next < 0) {
      out.tops.clear();
      out.can_end = false;
      return;
    }
    if (dfa.call_begin[static_cast<size_t>(next)] == dfa.call_begin[static_cast<size_t>(next) + 1] &&
        !dfa.is_final[static_cast<size_t>(next)]) {
      out.tops.assign(1, Frame{f.parent, f.rule, next});
      out.can_end = false;
      return;
    }
  }
  seeds_.clear();
  for (const Frame& f : in.tops) {
    const int32_t next = grammar_.rules[static_cast<size_t>(f.rule)].step(f.state, byte);
    if (next >= 0) seeds_.push_back({f.parent, f.rule, next});
  }
  closure(seeds_, out);
}

int64_t StackMachine::bytes_to_end(std::span<const Frame> tops) const {
  int64_t best = INT64_MAX;
  for (const Frame& top : tops) {
    int64_t d = grammar_.min_bytes[static_cast<size_t>(top.rule)][static_cast<size_t>(top.state)];
    for (int32_t p = top.parent; p >= 0; p = pool_[static_cast<size_t>(p)].parent) {
      const Frame& f = pool_[static_cast<size_t>(p)];
      d += grammar_.min_bytes[static_cast<size_t>(f.rule)][static_cast<size_t>(f.state)];
    }
    best = std::min(best, d);
  }
  return best;
}

}  // namespace fp8serve::grammar
