#pragma once
// One sequence's position in a CompiledGrammar: which tokens may come next (a bitmask over
// the logits, applied before sampling), and advancing by the sampled token.
//
//   GrammarMatcher m(compiled);
//   m.fill_next_token_bitmask(mask);      // per decode step
//   apply_token_bitmask(mask, logits);    // disallowed logits -> -inf
//   ... sample ...
//   m.accept_token(token);                // false: the token was not allowed
//   if (m.is_terminated()) finish;        // complete, and nothing but the end may follow
//
// The mask is the union over the stack tops of their cached accepted sets, plus the
// uncertain tokens that survive a check against the whole stack, plus the end tokens (EOS)
// once the text is complete.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "server/grammar/compiled_grammar.hpp"
#include "server/grammar/stack_machine.hpp"

namespace fp8serve::grammar {

class GrammarMatcher {
 public:
  // allow_end_tokens = false: EOS is never offered (ignore_eos); the caller ends the sequence
  // when is_terminated().
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, bool allow_end_tokens = true);

  // mask: vocab().mask_words() words; bit `id` set when token id may come next.
  void fill_next_token_bitmask(std::span<uint64_t> mask);
  bool accept_token(int32_t id);
  // Text straight into the grammar (tests, tools): false and unchanged if not allowed.
  bool accept_bytes(std::string_view bytes);

  // The fewest bytes that complete the text from here (0 when it may end now).
  int64_t bytes_to_end() const;

  // Budgets in tokens (max_tokens). The shortest completion in tokens is searched over the
  // vocabulary (ClosingGraph, shared by the grammar's matchers), so closing takes the model's
  // multi-byte tokens wherever they reach the end as soon, never bytes counted as tokens.
  //
  // The fewest tokens that complete the text from here (0 when it may end now) when at most
  // `limit`, otherwise limit + 1 (ClosingGraph::distance(): where free-form JSON has too many
  // states to search, a real completion's length instead). A first token that SentencePiece
  // writes without its space counts with its usual bytes here.
  int64_t tokens_to_end(int64_t limit);
  // Whether, after `token` (one the mask allowed), the text can still be completed within
  // `budget` more tokens: a way found (false also when the search ran out of work first).
  bool fits_after(int32_t token, int64_t budget);
  // The allowed tokens after which the text can still be completed within `budget` more
  // tokens, and the end tokens once it is complete; with budget + 1 == tokens_to_end(), only
  // the shortest ways. Returns false when some token's answer was not settled (the search ran
  // out of work): an empty mask then does not prove that no document fits.
  bool fill_budget_bitmask(std::span<uint64_t> mask, int64_t budget);

  bool can_end() const { return state_.can_end; }
  // Complete, and no byte may follow: the sequence should end now.
  bool is_terminated() const { return ended_ || (state_.can_end && state_.tops.empty()); }
  // An end token was accepted.
  bool ended() const { return ended_; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  // Runs `bytes` from the current state without committing (the caller truncates the pool):
  // the state after them (in scratch), or null when they are not a valid prefix.
  const StackSet* run_bytes(std::string_view bytes);
  int64_t bytes_to_end(const StackSet& set) const;
  bool advance(std::string_view bytes);
  // What token `id` writes here (the first token may write other bytes).
  std::string_view token_bytes(int32_t id) const;
  // This state as a node of the closing graph, whose lock the caller holds.
  int32_t graph_node(ClosingGraph& graph);
  int32_t graph_frame(ClosingGraph& graph, int32_t pool_id);

  std::shared_ptr<const CompiledGrammar> grammar_;
  bool allow_end_tokens_;
  StackMachine machine_;
  StackSet state_;
  StackSet scratch_a_, scratch_b_;
  std::vector<int32_t> candidates_;
  bool ended_ = false;
  bool first_token_ = true;
  std::vector<int32_t> graph_frames_;  // [pool node]: the same frame in the closing graph, or -1
  uint64_t graph_generation_ = 0;      // of the closing graph when graph_frames_ was filled
};

inline bool bitmask_test(std::span<const uint64_t> mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
}
inline void bitmask_set(std::span<uint64_t> mask, int32_t id) { mask[static_cast<size_t>(id) >> 6] |= 1ull << (id & 63); }

// logits[id] = -inf wherever the mask bit is clear (ids beyond the mask too).
void apply_token_bitmask(std::span<const uint64_t> mask, std::span<float> logits);
// How many tokens the mask allows.
int64_t bitmask_count(std::span<const uint64_t> mask);

}  // namespace fp8serve::grammar
