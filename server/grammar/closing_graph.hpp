#pragma once
// The fewest tokens that finish a document: a shortest path over a graph whose nodes are
// matcher states (the set of stacks a GrammarMatcher holds) and whose edges are tokens. This
// is what "close within max_tokens" needs: bytes are not tokens, and the shortest completion
// in tokens may even be longer in bytes (a one-token enum value against a three-token one).
//
// A node's edges come from one walk of the vocabulary trie from its state: every token the
// grammar allows there, grouped by the state it leads to (inside a free string, nearly the
// whole vocabulary is one edge back to the same state). Nodes and edges are made as searches
// meet them and kept, with each distance a search settles, so the graph belongs to the
// CompiledGrammar and every request with the same schema shares it. Its frames live in a
// StackMachine of its own that interns every return frame, so equal stacks are equal keys.
//
// A search is a breadth-first walk (every edge is one token), pruned by what nodes already
// know: a settled distance, a proven lower bound (no token writes more bytes than the longest
// one) and an upper bound, the length of a real way to the end. Upper bounds come from the
// canonical completion (each frame's first shortest way out in bytes, cut into the fewest
// tokens by dynamic programming) and from every way a search walks, carried back along its
// edges. Deciding a budget only needs some way within it ("fits"), which a known upper bound
// usually answers at once; distance() settles the exact value (tests, tokens_to_end()).
//
// Free-form JSON (json_object, an untyped object in a schema) has no end of states: each token
// may open more containers. A call therefore does at most kMaxWorkPerCall of work; a search
// that runs out answers with the shortest real way it knows (never below the truth, so a
// document it lets in can always be finished), or "unknown", and the next call goes on from
// the walks already cached.
//
//   auto lock = graph.lock();               // one call: the graph may be dropped only here
//   const int32_t now = graph.node_of(tops, can_end);
//   graph.fits(graph.step(now, token_bytes), limit) == ClosingGraph::Fit::yes
#include <climits>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/grammar/grammar.hpp"
#include "server/grammar/stack_machine.hpp"
#include "server/grammar/token_vocab.hpp"

namespace fp8serve::grammar {

class ClosingGraph {
 public:
  // The work one call may do: trie nodes stepped by its vocabulary walks, and edges followed by
  // its searches. bench_grammar measures ~25 ns a trie node on SmolLM2 (a walk steps a few
  // hundred outside strings, ~100k inside one), so a call stays within ~6 ms (plus the one walk
  // that crosses the line).
  static constexpr int64_t kMaxWorkPerCall = int64_t{1} << 18;
  // Past this the graph is dropped whole, like the mask cache.
  static constexpr size_t kMaxBytes = size_t{64} << 20;

  ClosingGraph(const Grammar& grammar, const TokenVocabulary& vocab);

  // Every call below needs the lock, taken once per question (it also renews the walks the
  // question may make). Taking it drops the graph when it has outgrown its budget, which
  // generation() then reports, so that callers forget the node and frame ids they hold.
  std::unique_lock<std::mutex> lock();
  uint64_t generation() const { return generation_; }
  // Every byte a shortest completion may need has a token of its own, so a completion of n
  // bytes always fits in n tokens (no lock needed).
  bool bytes_are_tokens() const { return byte_tokens_; }

  // A return frame whose parent is already this graph's (or below zero), as this graph's node.
  int32_t intern(const Frame& frame) { return machine_.push_frame(frame); }
  // The node of a state whose frames' parents are this graph's.
  int32_t node_of(std::vector<Frame> tops, bool can_end);
  // The node after `bytes` from `node`; -1 when the grammar does not allow them there.
  int32_t step(int32_t node, std::string_view bytes);

  // The fewest tokens from `node` to a state where the text may end, when that is at most
  // `limit`, and limit + 1 when more are needed. A search past its walks answers with the
  // canonical completion's tokens instead (when at most `limit`; limit + 1 otherwise): a
  // real way, so never below the truth.
  int32_t distance(int32_t node, int32_t limit);
  // Whether distance(node) is at most `limit`, answered by a way no longer (found or known)
  // or a proof; unknown when the search ran out of walks first.
  enum class Fit { yes, no, unknown };
  Fit fits(int32_t node, int32_t limit);
  // Sets in `mask` every token after which fits() says yes; false when some said unknown.
  bool fill_within(int32_t node, int32_t limit, std::span<uint64_t> mask);

  struct Stats {
    int64_t nodes = 0;
    int64_t expansions = 0;    // trie walks so far
    int64_t expand_steps = 0;  // trie nodes they stepped through
    double expand_seconds = 0; // their total time
    int64_t searches = 0;
    int64_t gave_up = 0;       // searches answered by the canonical completion
    size_t bytes = 0;
    int64_t resets = 0;
  };
  Stats stats() const { return stats_; }

 private:
  struct Edge {
    int32_t to;
    std::vector<int32_t> ids;    // sparse form
    std::vector<uint64_t> bits;  // dense form ([mask words]) when the edge holds many tokens
  };
  struct Node {
    std::vector<Frame> tops;
    bool can_end = false;
    bool expanded = false;
    bool canonical = false;  // upper includes the canonical completion's tokens
    int32_t exact = -1;      // settled distance
    int32_t lower = 0;       // proven lower bound
    int32_t upper = 0;       // a real way's length (INT32_MAX when none is known)
    int32_t gave_up_at = -1; // the largest limit a search from here ran out of work on
    std::vector<Edge> edges;
  };

  struct Search {
    int64_t best = INT64_MAX;  // the shortest way found (a real one)
    bool gave_up = false;      // ran out of walks
  };
  // Breadth-first from `start` up to `limit` tokens: to settle its distance, or to the first
  // way within `limit`.
  Search search(int32_t start, int32_t limit, bool settle);
  void relax_uppers(const std::vector<int32_t>& nodes);
  static int32_t value(const Node& n);  // 0 at an end, else the settled distance or upper
  void expand(int32_t id);
  // The canonical completion's tokens as `upper`, here and on the states along it.
  void settle_canonical(int32_t id);
  // The first shortest way out of `rule` from `state`, in bytes (memoized).
  const std::string& shortest_exit(RuleId rule, int32_t state);
  // The fewest tokens that write `text` (empty when no cut into tokens exists).
  std::vector<int32_t> fewest_tokens(std::string_view text) const;
  void reset();

  const Grammar& grammar_;
  const TokenVocabulary& vocab_;
  bool byte_tokens_ = true;
  std::mutex mutex_;
  uint64_t generation_ = 0;
  StackMachine machine_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, int32_t> index_;  // state key -> node
  std::vector<StackSet> walk_;                      // [trie depth + 1], the states of a trie walk
  std::vector<uint32_t> seen_;                      // [node]: the search that last reached it
  std::vector<int32_t> parent_;                     // [node]: where that search reached it from
  uint32_t search_stamp_ = 0;
  int64_t work_left_ = 0;                           // trie steps this call may still take
  std::vector<std::vector<std::string>> exits_;     // [rule][state]: shortest_exit()
  std::vector<std::vector<uint8_t>> exit_known_;
  Stats stats_;
};

}  // namespace fp8serve::grammar
