#pragma once
// Added and special tokens ("<|im_start|>", "<s>", "<think>"): matched in the raw text before
// normalization and BPE, leftmost match first and the longest of those, as HF tokenizers'
// AddedVocabulary does, with its lstrip / rstrip / single_word flags.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fp8serve {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = true;       // skipped by decode(skip_special_tokens = true)
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not inside a word
  bool normalized = false;   // matched in the normalized text instead of the raw text
};

// A piece of the input: plain text (id < 0) for the normalizer and model, or a matched token.
struct Fragment {
  std::string_view text;
  int32_t id = -1;
};

class AddedVocab {
 public:
  AddedVocab() = default;
  explicit AddedVocab(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // Splits `text` on the tokens; text fragments are never empty.
  std::vector<Fragment> split(std::string_view text) const;

 private:
  bool word_boundary_ok(std::string_view text, std::size_t begin, std::size_t end) const;

  std::vector<AddedToken> tokens_;
  // First byte of a token -> indices into tokens_, longest first.
  std::unordered_map<unsigned char, std::vector<std::size_t>> by_first_byte_;
};

// Unicode White_Space, as Rust's char::is_whitespace (used by lstrip / rstrip).
bool is_unicode_whitespace(char32_t cp);

}  // namespace fp8serve
