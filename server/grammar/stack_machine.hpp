#pragma once
// Runs a Grammar over bytes: a set of parallel stacks (an ambiguous grammar may be in several
// places at once, e.g. two anyOf alternatives that both start with '{'). A stack is a frame
// (rule, state) on top of a chain of return frames kept in a pool: each return frame is the
// state the caller continues at once the callee ends. Stacks share their tails in the pool,
// so a step copies only the top frames.
//
// Pool nodes come in two kinds: committed (the accepted text; interned, so equal return
// frames are one node) and speculative (a mask computation trying tokens; appended without a
// hash lookup and dropped with truncate()).
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "server/grammar/grammar.hpp"

namespace fp8serve::grammar {

// Parent ids below zero end a stack: popping kRootParent means the whole text may end here;
// popping kExitParent means the rule under study ends (token-mask classification).
inline constexpr int32_t kRootParent = -1;
inline constexpr int32_t kExitParent = -2;

struct Frame {
  int32_t parent;  // pool node id of the return frame below, or kRootParent / kExitParent
  RuleId rule;
  int32_t state;
  bool operator==(const Frame&) const = default;
};

struct StackSet {
  std::vector<Frame> tops;  // frames whose state reads a byte; distinct
  bool can_end = false;     // some stack may pop its bottom frame here
  bool empty() const { return tops.empty() && !can_end; }
};

class StackMachine {
 public:
  // More stack tops than this (a wildly ambiguous grammar) are cut: the matcher stays bounded
  // and sound (it only ever follows real paths), at worst reporting a dead end.
  static constexpr size_t kMaxTops = 1024;

  explicit StackMachine(const Grammar& grammar) : grammar_(grammar) {}

  // The stacks reachable from `seeds` without reading a byte: entering called rules, and
  // returning from rules that may end.
  void closure(std::span<const Frame> seeds, StackSet& out);
  void start(StackSet& out, RuleId rule, int32_t state, int32_t parent);
  // Reads one byte; `out` may not alias `in`.
  void step(const StackSet& in, uint8_t byte, StackSet& out);

  // Speculative work: remember the pool size, and drop what was added since.
  size_t mark() const { return pool_.size(); }
  void truncate(size_t mark) { pool_.resize(mark); }
  // Committed steps intern return frames; speculative ones (the default) do not.
  void set_committing(bool committing) { committing_ = committing; }
  size_t pool_size() const { return pool_.size(); }
  const Frame& node(int32_t id) const { return pool_[static_cast<size_t>(id)]; }
  // The pool node for a return frame (interned when committing): how a stack built elsewhere
  // is copied in, frame by frame from its bottom.
  int32_t push_frame(const Frame& f) { return push_return(f.parent, f.rule, f.state); }
  // The fewest bytes that end the cheapest of these stacks: each frame's min_bytes, summed
  // down its return frames.
  int64_t bytes_to_end(std::span<const Frame> tops) const;
  // Forgets every pool node, committed ones too.
  void clear() {
    pool_.clear();
    interned_.clear();
  }

 private:
  int32_t push_return(int32_t parent, RuleId rule, int32_t state);

  struct FrameHash {
    size_t operator()(const Frame& f) const {
      return std::hash<uint64_t>{}((static_cast<uint64_t>(static_cast<uint32_t>(f.parent)) << 32) ^
                                   (static_cast<uint64_t>(static_cast<uint32_t>(f.rule)) << 20) ^
                                   static_cast<uint32_t>(f.state));
    }
  };

  const Grammar& grammar_;
  std::vector<Frame> pool_;
  std::unordered_map<Frame, int32_t, FrameHash> interned_;
  bool committing_ = false;
  std::vector<Frame> work_, seen_, seeds_;  // scratch
};

}  // namespace fp8serve::grammar
