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

#include "model/grammar/compiled_grammar.hpp"
#include "model/grammar/stack_machine.hpp"

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
  // Budget-aware closing: only single-byte tokens on a shortest way to the end (and the end
  // tokens once complete). Following it, the text completes in exactly bytes_to_end() tokens.
  void fill_closing_bitmask(std::span<uint64_t> mask);
  // Whether, after `token` (which the mask allowed), the text can still be completed within
  // `budget` more tokens (one byte each at worst).
  bool can_finish_after(int32_t token, int64_t budget);

  bool can_end() const { return state_.can_end; }
  // Complete, and no byte may follow: the sequence should end now.
  bool is_terminated() const { return ended_ || (state_.can_end && state_.tops.empty()); }
  // An end token was accepted.
  bool ended() const { return ended_; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  // Runs `bytes` from the current state without committing; true when they are a valid prefix.
  bool check_bytes(std::string_view bytes);
  int64_t bytes_to_end(const StackSet& set) const;
  bool advance(std::string_view bytes);

  std::shared_ptr<const CompiledGrammar> grammar_;
  bool allow_end_tokens_;
  StackMachine machine_;
  StackSet state_;
  StackSet scratch_a_, scratch_b_;
  std::vector<int32_t> candidates_;
  bool ended_ = false;
  bool first_token_ = true;
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
