#pragma once
// Streaming detokenization: each generated id goes in, text comes out only once it is valid
// UTF-8 (a byte-level token may end inside a character; an emoji can span four tokens).
//
// Bytes that end in the middle of a character are held back until the character completes.
// Bytes that can never become valid UTF-8 come out at once as U+FFFD, as the full decode shows
// them. A character the sequence ends inside is dropped (vLLM's incremental detokenizer never
// emits it either), so the concatenation of every push() equals tokenizer.decode(all ids), less
// that decode's final U+FFFD when the ids end inside a character.
#include <cstdint>
#include <string>

#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve {

class IncrementalDetokenizer {
 public:
  // PRECOND: tokenizer outlives this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  std::string push(int32_t id);
  // The sequence ended: drops the incomplete character held back, if any.
  void finish() { pending_.clear(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  bool at_start_ = true;  // SentencePiece drops the first piece's dummy-prefix space
  std::string pending_;   // bytes not yet released: at most an incomplete character
};

}  // namespace fp8serve
