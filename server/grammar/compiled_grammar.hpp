#pragma once
// A Grammar bound to a vocabulary, with the adaptive token-mask cache (the idea of xgrammar's
// adaptive mask cache; our own code). For a stack top (rule, state), every usable token is:
//   accepted  - its bytes stay inside the rule (entering callees and returning is fine), so
//               it is valid whatever the stack below holds;
//   rejected  - its bytes die inside the rule, or leave it with a byte that can never follow
//               the rule (not in FOLLOW(rule));
//   uncertain - its bytes leave the rule with a byte that may follow it: only the stack below
//               can tell, so the matcher checks these few at run time.
// The classification is a walk of the vocabulary trie, computed the first time a (rule, state)
// is met and kept for every later request using the same compiled grammar; inside a JSON
// string almost all of a 49k vocabulary is accepted and only tokens with a quote in the
// middle are left for the run-time check.
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "server/grammar/closing_graph.hpp"
#include "server/grammar/grammar.hpp"
#include "server/grammar/token_vocab.hpp"

namespace fp8serve::grammar {

struct StateMasks {
  bool plain_slice = false;             // the vocabulary's whole plain slice is accepted too
  std::vector<uint64_t> accepted_bits;  // dense form, [mask words]; empty when sparse
  std::vector<int32_t> accepted_ids;    // sparse form
  std::vector<int32_t> uncertain;       // token ids, in trie (byte) order
  size_t bytes() const { return 8 * accepted_bits.size() + 4 * (accepted_ids.size() + uncertain.size()); }
};

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }

  // Thread-safe; computed on first use. The cache is dropped whole when it outgrows its
  // memory budget (holders keep their shared_ptr).
  std::shared_ptr<const StateMasks> state_masks(RuleId rule, int32_t state) const;

  struct CacheStats {
    int64_t num_classified = 0;   // (rule, state) walks so far
    double classify_seconds = 0;  // their total time
    size_t cache_bytes = 0;
  };
  CacheStats cache_stats() const;

  // The states met while closing documents within max_tokens, and their distances in tokens
  // to the end: shared by every matcher of this grammar (it locks itself).
  ClosingGraph& closing_graph() const { return closing_graph_; }

  static constexpr size_t kMaxCacheBytes = size_t{256} << 20;

 private:
  StateMasks classify(RuleId rule, int32_t state) const;
  // How many plain JSON-string characters, in any order, the rule takes from `state` without
  // leaving it (up to kPlainSliceChars). Memoized; called under mutex_.
  int plain_capacity(RuleId rule, int32_t state) const;

  Grammar grammar_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mutex_;
  mutable std::vector<std::vector<std::shared_ptr<const StateMasks>>> cache_;  // [rule][state]
  mutable std::vector<std::vector<int8_t>> plain_capacity_;                    // [rule][state], -1 unknown
  mutable CacheStats stats_;
  mutable ClosingGraph closing_graph_;
};

}  // namespace fp8serve::grammar
