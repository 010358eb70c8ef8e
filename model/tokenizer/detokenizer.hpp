#pragma once
// Streaming detokenization: each generated id goes in, text comes out only once it is valid
// UTF-8 (a byte-level token may end inside a character; an emoji can span four tokens).
// The concatenation of every push() and the final flush() equals tokenizer.decode(all ids).
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
  // The held-back tail (an incomplete character becomes U+FFFD); the stream may go on after.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  bool at_start_ = true;  // SentencePiece drops the first piece's dummy-prefix space
  std::string pending_;   // bytes not yet released: at most an incomplete character
};

}  // namespace fp8serve
