#include "server/grammar/closing_graph.hpp"

#include <algorithm>
#include <chrono>
#include <climits>

namespace fp8serve::grammar {

namespace {

bool frame_less(const Frame& a, const Frame& b) {
  if (a.parent != b.parent) return a.parent < b.parent;
  if (a.rule != b.rule) return a.rule < b.rule;
  return a.state < b.state;
}

std::string state_key(const std::vector<Frame>& tops, bool can_end) {
  std::string key(tops.size() * sizeof(Frame) + 1, '\0');
  for (size_t i = 0; i < tops.size(); ++i) {
    const int32_t words[3] = {tops[i].parent, tops[i].rule, tops[i].state};
    std::copy_n(reinterpret_cast<const char*>(words), sizeof words, key.data() + i * sizeof words);
  }
  key.back() = can_end ? 1 : 0;
  return key;
}

}  // namespace

ClosingGraph::ClosingGraph(const Grammar& grammar, const TokenVocabulary& vocab)
    : grammar_(grammar), vocab_(vocab), machine_(grammar) {
  // The bytes of shortest completions: those of transitions one byte closer to their rule's
  // end. When each has a token of its own, n bytes always fit in n tokens (SmolLM2's vocabulary
  // lacks some control characters and invalid UTF-8 bytes, which no shortest JSON text needs).
  for (size_t r = 0; r < grammar_.rules.size(); ++r) {
    const Dfa& dfa = grammar_.rules[r];
    std::vector<uint8_t> tight(static_cast<size_t>(dfa.num_classes), 0);
    for (int32_t s = 0; s < dfa.num_states; ++s)
      for (int32_t c = 0; c < dfa.num_classes; ++c) {
        const int32_t t = dfa.next[static_cast<size_t>(s) * static_cast<size_t>(dfa.num_classes) + static_cast<size_t>(c)];
        if (t >= 0 && grammar_.min_bytes[r][static_cast<size_t>(t)] + 1 == grammar_.min_bytes[r][static_cast<size_t>(s)])
          tight[static_cast<size_t>(c)] = 1;
      }
    for (int b = 0; b < 256 && dfa.num_states > 0; ++b)
      if (tight[dfa.byte_class[static_cast<size_t>(b)]] && vocab_.byte_token(static_cast<uint8_t>(b)) < 0) byte_tokens_ = false;
  }
  machine_.set_committing(true);
  walk_.resize(static_cast<size_t>(vocab_.max_token_bytes()) + 1);
  exits_.resize(grammar_.rules.size());  // a rule's states are added when first asked for
  exit_known_.resize(grammar_.rules.size());
}

std::unique_lock<std::mutex> ClosingGraph::lock() {
  std::unique_lock<std::mutex> held(mutex_);
  if (stats_.bytes + 16 * machine_.pool_size() > kMaxBytes) reset();
  work_left_ = kMaxWorkPerCall;
  return held;
}

void ClosingGraph::reset() {
  machine_.clear();
  nodes_.clear();
  index_.clear();
  seen_.clear();
  parent_.clear();
  for (auto& rule : exits_) rule = {};
  for (auto& rule : exit_known_) rule = {};
  stats_.bytes = 0;
  stats_.nodes = 0;
  ++stats_.resets;
  ++generation_;
}

int32_t ClosingGraph::node_of(std::vector<Frame> tops, bool can_end) {
  std::sort(tops.begin(), tops.end(), frame_less);
  std::string key = state_key(tops, can_end);
  if (const auto it = index_.find(key); it != index_.end()) return it->second;
  Node n;
  n.can_end = can_end;
  if (!can_end) {
    const int64_t bytes = machine_.bytes_to_end(tops);
    const int64_t longest = std::max<int64_t>(1, vocab_.max_token_bytes());
    n.lower = static_cast<int32_t>(std::min<int64_t>(INT32_MAX / 2, std::max<int64_t>(1, (bytes + longest - 1) / longest)));
    n.upper = byte_tokens_ ? static_cast<int32_t>(std::min<int64_t>(INT32_MAX, bytes)) : INT32_MAX;
  }
  n.tops = std::move(tops);
  stats_.bytes += key.size() * 2 + sizeof(Node) + 64;
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(std::move(n));
  index_.emplace(std::move(key), id);
  ++stats_.nodes;
  return id;
}

int32_t ClosingGraph::step(int32_t node, std::string_view bytes) {
  if (bytes.empty()) return -1;
  StackSet cur{nodes_[static_cast<size_t>(node)].tops, nodes_[static_cast<size_t>(node)].can_end};
  StackSet next;
  for (size_t i = 0; i < bytes.size(); ++i) {
    machine_.step(cur, static_cast<uint8_t>(bytes[i]), next);
    if (next.tops.empty() && !(i + 1 == bytes.size() && next.can_end)) return -1;
    std::swap(cur, next);
  }
  return node_of(std::move(cur.tops), cur.can_end);
}

void ClosingGraph::expand(int32_t id) {
  const auto t0 = std::chrono::steady_clock::now();
  const TokenTrie& trie = vocab_.trie();
  walk_[0] = StackSet{nodes_[static_cast<size_t>(id)].tops, nodes_[static_cast<size_t>(id)].can_end};
  std::vector<Edge> edges;
  std::unordered_map<int32_t, size_t> edge_of;  // successor node -> its edge
  // Most tokens in a row lead to the same state (a string's characters): remember the last.
  std::vector<Frame> last_tops;
  bool last_can_end = false;
  int32_t last_to = -1;
  size_t i = 0;
  int64_t steps = 0;
  while (i < trie.nodes.size()) {
    const TrieNode& t = trie.nodes[i];
    StackSet& s = walk_[t.depth];
    ++steps;
    machine_.step(walk_[t.depth - 1u], t.byte, s);
    if (s.empty()) {
      i = static_cast<size_t>(t.subtree_end);
      continue;
    }
    if (t.own_end > t.tok_first) {
      if (last_to < 0 || s.can_end != last_can_end || s.tops != last_tops) {
        last_tops = s.tops;
        last_can_end = s.can_end;
        last_to = node_of(s.tops, s.can_end);
      }
      auto [it, added] = edge_of.try_emplace(last_to, edges.size());
      if (added) edges.push_back(Edge{last_to, {}, {}});
      std::vector<int32_t>& ids = edges[it->second].ids;
      for (int32_t k = t.tok_first; k < t.own_end; ++k) ids.push_back(trie.sorted[static_cast<size_t>(k)]);
    }
    i = s.tops.empty() ? static_cast<size_t>(t.subtree_end) : i + 1;
  }
  for (Edge& e : edges) {
    if (e.ids.size() * 32 > static_cast<size_t>(vocab_.mask_size())) {
      e.bits.assign(static_cast<size_t>(vocab_.mask_words()), 0);
      for (const int32_t t : e.ids) e.bits[static_cast<size_t>(t) >> 6] |= 1ull << (t & 63);
      e.ids = {};
      stats_.bytes += 8 * e.bits.size();
    } else {
      e.ids.shrink_to_fit();
      stats_.bytes += 4 * e.ids.size();
    }
    stats_.bytes += sizeof(Edge);
  }
  Node& n = nodes_[static_cast<size_t>(id)];
  n.edges = std::move(edges);
  n.expanded = true;
  ++stats_.expansions;
  stats_.expand_steps += steps;
  work_left_ -= steps;
  stats_.expand_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int32_t ClosingGraph::value(const Node& n) { return n.can_end ? 0 : n.exact >= 0 ? n.exact : n.upper; }

ClosingGraph::Search ClosingGraph::search(int32_t start, int32_t limit, bool settle) {
  ++stats_.searches;
  settle_canonical(start);
  if (++search_stamp_ == 0) {  // the stamps wrapped: forget them all
    std::fill(seen_.begin(), seen_.end(), 0);
    search_stamp_ = 1;
  }
  std::vector<int32_t> visited;
  auto reach = [&](int32_t id, int32_t from) {
    if (seen_.size() < nodes_.size()) seen_.resize(nodes_.size(), 0), parent_.resize(nodes_.size(), -1);
    if (seen_[static_cast<size_t>(id)] == search_stamp_) return false;
    seen_[static_cast<size_t>(id)] = search_stamp_;
    parent_[static_cast<size_t>(id)] = from;
    visited.push_back(id);
    return true;
  };
  std::vector<int32_t> level{start}, next;
  reach(start, -1);
  Search r;
  int32_t best_node = -1;  // the node the best way goes through
  int64_t best_depth = 0;
  // Level d holds the nodes first reached after d tokens. Settling, every node of a level
  // before `best` is settled, expanded or shown unable to do better, so `best` is exact when
  // the walk ends; otherwise the first way within `limit` will do.
  auto done = [&](int64_t d) { return settle ? d >= r.best : r.best <= limit; };
  for (int64_t d = 0; !level.empty() && !done(d) && d <= limit && !r.gave_up; ++d) {
    next.clear();
    for (const int32_t id : level) {
      {
        const Node& n = nodes_[static_cast<size_t>(id)];
        const int64_t through = d + static_cast<int64_t>(value(n));
        if (through < r.best) r.best = through, best_node = id, best_depth = d;
        if (n.can_end || n.exact >= 0 || done(d)) continue;  // every way through it is known
        if (d + n.lower >= r.best || d + n.lower > limit) continue;
      }
      if (work_left_ <= 0) {
        r.gave_up = true;
        break;
      }
      if (!nodes_[static_cast<size_t>(id)].expanded) expand(id);
      work_left_ -= static_cast<int64_t>(nodes_[static_cast<size_t>(id)].edges.size());
      for (const Edge& e : nodes_[static_cast<size_t>(id)].edges)
        if (reach(e.to, id)) next.push_back(e.to);
    }
    std::swap(level, next);
  }
  if (r.gave_up) ++stats_.gave_up;
  // The way found: every node on it lies on a shortest way when settled, and has a way no
  // longer than the rest of it in any case.
  const bool exact = settle && !r.gave_up;
  for (int32_t id = best_node; id >= 0 && r.best < INT32_MAX; id = parent_[static_cast<size_t>(id)]) {
    Node& n = nodes_[static_cast<size_t>(id)];
    const auto rest = static_cast<int32_t>(r.best - best_depth);
    if (!n.can_end && n.exact < 0) {
      if (exact) n.exact = rest;
      n.upper = std::min(n.upper, rest);
    }
    --best_depth;
  }
  if (!r.gave_up && r.best > limit) {
    Node& n = nodes_[static_cast<size_t>(start)];
    n.lower = std::max(n.lower, limit + 1);
  }
  relax_uppers(visited);
  return r;
}

void ClosingGraph::relax_uppers(const std::vector<int32_t>& nodes) {
  // Ways through the edges walked, from the end backwards (reverse breadth-first order), a
  // few passes: real ways, so the next token's question is often answered without a search.
  for (int pass = 0; pass < 4; ++pass) {
    bool changed = false;
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      Node& n = nodes_[static_cast<size_t>(*it)];
      if (!n.expanded || n.can_end || n.exact >= 0) continue;
      int32_t best = n.upper;
      for (const Edge& e : n.edges) {
        const int32_t v = value(nodes_[static_cast<size_t>(e.to)]);
        if (v < INT32_MAX && v + 1 < best) best = v + 1;
      }
      if (best < n.upper) n.upper = best, changed = true;
    }
    if (!changed) break;
  }
}

int32_t ClosingGraph::distance(int32_t node, int32_t limit) {
  const Node& n = nodes_[static_cast<size_t>(node)];
  if (n.can_end) return 0;
  if (n.exact >= 0) return n.exact <= limit ? n.exact : limit + 1;
  if (n.lower > limit) return limit + 1;
  const Search r = search(node, limit, /*settle=*/true);
  // Past its walks the search answers with the shortest way it has seen: a real one.
  return r.best <= limit ? static_cast<int32_t>(r.best) : limit + 1;
}

ClosingGraph::Fit ClosingGraph::fits(int32_t node, int32_t limit) {
  {
    const Node& n = nodes_[static_cast<size_t>(node)];
    if (value(n) <= limit) return Fit::yes;
    if (n.lower > limit || (n.exact >= 0 && n.exact > limit)) return Fit::no;
    if (limit <= n.gave_up_at) return Fit::unknown;  // as far as a search with as much room got
  }
  const Search r = search(node, limit, /*settle=*/false);
  if (r.best <= limit) return Fit::yes;
  if (!r.gave_up) return Fit::no;
  nodes_[static_cast<size_t>(node)].gave_up_at = limit;
  return Fit::unknown;
}

void ClosingGraph::settle_canonical(int32_t id) {
  if (nodes_[static_cast<size_t>(id)].canonical || nodes_[static_cast<size_t>(id)].can_end) return;
  nodes_[static_cast<size_t>(id)].canonical = true;
  // The frame chain with the fewest bytes to the end, and its first shortest way out.
  const std::vector<Frame> tops = nodes_[static_cast<size_t>(id)].tops;
  const Frame* top = nullptr;
  int64_t fewest = INT64_MAX;
  for (const Frame& f : tops) {
    const int64_t b = machine_.bytes_to_end(std::span<const Frame>(&f, 1));
    if (b < fewest) fewest = b, top = &f;
  }
  if (top == nullptr) return;
  std::string text = shortest_exit(top->rule, top->state);
  for (int32_t p = top->parent; p >= 0; p = machine_.node(p).parent) {
    const Frame f = machine_.node(p);
    text += shortest_exit(f.rule, f.state);
  }
  const std::vector<int32_t> tokens = fewest_tokens(text);
  if (tokens.empty()) return;
  auto left = static_cast<int32_t>(tokens.size());
  int32_t at = id;
  nodes_[static_cast<size_t>(at)].upper = std::min(nodes_[static_cast<size_t>(at)].upper, left);
  for (const int32_t t : tokens) {
    at = step(at, vocab_.bytes(t));
    if (at < 0) return;  // cannot happen: the text is a completion
    --left;
    Node& n = nodes_[static_cast<size_t>(at)];
    n.upper = std::min(n.upper, left);
  }
}

const std::string& ClosingGraph::shortest_exit(RuleId rule, int32_t state) {
  if (exits_[static_cast<size_t>(rule)].empty()) {
    exits_[static_cast<size_t>(rule)].resize(static_cast<size_t>(grammar_.rules[static_cast<size_t>(rule)].num_states));
    exit_known_[static_cast<size_t>(rule)].assign(static_cast<size_t>(grammar_.rules[static_cast<size_t>(rule)].num_states), 0);
  }
  std::string& memo = exits_[static_cast<size_t>(rule)][static_cast<size_t>(state)];
  if (exit_known_[static_cast<size_t>(rule)][static_cast<size_t>(state)]) return memo;
  const Dfa& dfa = grammar_.rules[static_cast<size_t>(rule)];
  const std::vector<int32_t>& m = grammar_.min_bytes[static_cast<size_t>(rule)];
  auto rule_min = [&](RuleId r) { return grammar_.min_bytes[static_cast<size_t>(r)][static_cast<size_t>(grammar_.rules[static_cast<size_t>(r)].start)]; };
  std::string out;
  for (int32_t s = state; m[static_cast<size_t>(s)] > 0;) {
    // A byte one closer to the end, one with a token of its own if there is such a byte.
    int chosen = -1;
    for (int b = 0; b < 256; ++b) {
      const int32_t t = dfa.step(s, static_cast<uint8_t>(b));
      if (t < 0 || m[static_cast<size_t>(t)] + 1 != m[static_cast<size_t>(s)]) continue;
      if (chosen < 0 || (vocab_.byte_token(static_cast<uint8_t>(chosen)) < 0 && vocab_.byte_token(static_cast<uint8_t>(b)) >= 0))
        chosen = b;
    }
    if (chosen >= 0) {
      out += static_cast<char>(chosen);
      s = dfa.step(s, static_cast<uint8_t>(chosen));
      continue;
    }
    // Otherwise a call on a shortest way (one that writes something first: empty calls cannot
    // loop, but they need not be taken either).
    const DfaCall* call = nullptr;
    for (const DfaCall& c : dfa.calls_of(s))
      if (rule_min(c.rule) + m[static_cast<size_t>(c.target)] == m[static_cast<size_t>(s)] && (call == nullptr || rule_min(c.rule) > 0))
        call = &c;
    if (call == nullptr) break;  // cannot happen: min_bytes is a shortest way
    const DfaCall c = *call;
    out += shortest_exit(c.rule, grammar_.rules[static_cast<size_t>(c.rule)].start);
    s = c.target;
  }
  memo = std::move(out);  // the recursion only sizes other rules' vectors, so `memo` stands
  exit_known_[static_cast<size_t>(rule)][static_cast<size_t>(state)] = 1;
  stats_.bytes += memo.size() + 32;
  return memo;
}

std::vector<int32_t> ClosingGraph::fewest_tokens(std::string_view text) const {
  const TokenTrie& trie = vocab_.trie();
  const size_t n = text.size();
  std::vector<int32_t> count(n + 1, INT32_MAX), token(n + 1, -1), from(n + 1, -1);
  count[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    if (count[i] == INT32_MAX) continue;
    // Down the trie along text[i..]: the children of a node are its next node and their
    // subtree ends, in byte order.
    size_t child = 0, end = trie.nodes.size();
    for (size_t j = i; j < n && child < end; ++j) {
      const auto b = static_cast<uint8_t>(text[j]);
      while (child < end && trie.nodes[child].byte < b) child = static_cast<size_t>(trie.nodes[child].subtree_end);
      if (child >= end || trie.nodes[child].byte != b) break;
      const TrieNode& t = trie.nodes[child];
      if (t.own_end > t.tok_first && count[i] + 1 < count[j + 1]) {
        count[j + 1] = count[i] + 1;
        token[j + 1] = trie.sorted[static_cast<size_t>(t.tok_first)];
        from[j + 1] = static_cast<int32_t>(i);
      }
      end = static_cast<size_t>(t.subtree_end);
      child = child + 1;
    }
  }
  std::vector<int32_t> out;
  if (count[n] == INT32_MAX || n == 0) return out;
  for (auto at = static_cast<int32_t>(n); at > 0; at = from[static_cast<size_t>(at)]) out.push_back(token[static_cast<size_t>(at)]);
  std::reverse(out.begin(), out.end());
  return out;
}

bool ClosingGraph::fill_within(int32_t node, int32_t limit, std::span<uint64_t> mask) {
  if (!nodes_[static_cast<size_t>(node)].expanded) expand(node);  // the question itself: always answered
  bool settled = true;
  // Indices, not references: searches may add nodes.
  for (size_t e = 0; e < nodes_[static_cast<size_t>(node)].edges.size(); ++e) {
    const Fit fit = fits(nodes_[static_cast<size_t>(node)].edges[e].to, limit);
    settled = settled && fit != Fit::unknown;
    if (fit != Fit::yes) continue;
    const Edge& edge = nodes_[static_cast<size_t>(node)].edges[e];
    if (!edge.bits.empty()) {
      for (size_t w = 0; w < mask.size() && w < edge.bits.size(); ++w) mask[w] |= edge.bits[w];
    } else {
      for (const int32_t t : edge.ids) mask[static_cast<size_t>(t) >> 6] |= 1ull << (t & 63);
    }
  }
  return settled;
}

}  // namespace fp8serve::grammar
