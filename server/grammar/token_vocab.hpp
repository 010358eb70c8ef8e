#pragma once
// The model's vocabulary as the grammar sees it: the bytes each token writes, which tokens
// may appear inside grammar text at all (never special tokens such as <|im_end|>, never ids the
// tokenizer does not define), the end tokens (EOS) that finish a complete text, and a byte
// trie over the usable tokens that the token-mask computation walks.
//
// The trie is flat, in pre-order: a node is one byte at one depth; its subtree is the index
// range [node + 1, subtree_end), and the tokens at or below it are the range
// [tok_first, tok_last) of `sorted` (token ids sorted by their bytes), of which
// [tok_first, own_end) end exactly at the node.
//
// The plain slice (the slicer idea of llguidance; our own code): tokens made only of 1 to
// kPlainSliceChars characters that JSON strings hold unescaped. Inside a string, a state that
// takes any such run accepts the whole slice at once, and only the other tokens (a second,
// smaller trie) are walked.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8serve {
class Tokenizer;
}

namespace fp8serve::grammar {

struct TrieNode {
  uint8_t byte;
  uint16_t depth;  // 1 for a token's first byte
  int32_t subtree_end;
  int32_t tok_first, own_end, tok_last;
};

struct TokenTrie {
  std::vector<TrieNode> nodes;
  std::vector<int32_t> sorted;  // token ids by their bytes
};

inline constexpr int kPlainSliceChars = 16;

class TokenVocabulary {
 public:
  // `token_bytes[id]`: what token id writes; `usable[id]`: may appear inside grammar text;
  // `mask_size`: the number of logits (may exceed token_bytes.size(): padding ids, never usable).
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<uint8_t> usable, std::vector<int32_t> end_tokens,
                  int32_t mask_size);

  // From a model's tokenizer: special tokens and empty tokens are unusable; non-special added
  // tokens (Qwen's <tool_call>, <think>) write their text. SentencePiece drops the leading
  // space of the first generated piece: those first-token variants are kept aside.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer, int32_t mask_size,
                                                               std::vector<int32_t> end_tokens);

  int32_t mask_size() const { return mask_size_; }
  int32_t mask_words() const { return (mask_size_ + 63) / 64; }
  std::string_view bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  bool usable(int32_t id) const { return id >= 0 && id < static_cast<int32_t>(usable_.size()) && usable_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  bool is_end_token(int32_t id) const;

  // The token that writes exactly `byte`, or -1 (byte-level vocabularies have all 256).
  int32_t byte_token(uint8_t byte) const { return byte_tokens_[byte]; }
  const TokenTrie& trie() const { return trie_; }
  const TokenTrie& non_plain_trie() const { return non_plain_trie_; }  // usable tokens outside the plain slice
  const std::vector<uint64_t>& plain_slice() const { return plain_slice_; }  // bitmask of the slice
  const std::vector<int32_t>& sorted_tokens() const { return trie_.sorted; }
  int32_t max_token_bytes() const { return max_token_bytes_; }
  int32_t num_usable() const { return static_cast<int32_t>(trie_.sorted.size()); }
  // (id, bytes) for tokens that write something else as the first token of a text.
  const std::vector<std::pair<int32_t, std::string>>& first_token_variants() const { return first_variants_; }
  void set_first_token_variants(std::vector<std::pair<int32_t, std::string>> variants) { first_variants_ = std::move(variants); }

 private:
  void build_trie(TokenTrie& trie, std::vector<int32_t> ids);

  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> usable_;
  std::vector<int32_t> end_tokens_;
  int32_t mask_size_;
  TokenTrie trie_, non_plain_trie_;
  std::array<int32_t, 256> byte_tokens_;
  std::vector<uint64_t> plain_slice_;
  int32_t max_token_bytes_ = 0;
  std::vector<std::pair<int32_t, std::string>> first_variants_;
};

}  // namespace fp8serve::grammar
