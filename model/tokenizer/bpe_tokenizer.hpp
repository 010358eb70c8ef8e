#pragma once
// Byte-level BPE as HF tokenizers runs it: added tokens split off first, NFC where declared,
// the pre-tokenizer's splits, then merges applied by rank inside each word. Built from a
// tokenizer.json (tokenizer_json.cpp) or from a GGUF "gpt2" vocabulary (gguf_tokenizer.cpp).
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/added_vocab.hpp"
#include "model/tokenizer/pre_tokenizer.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve {

struct BpeConfig {
  std::vector<std::pair<std::string, int32_t>> vocab;  // token string (byte-level form) -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added_tokens;
  bool nfc = false;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool byte_level_decoder = true;
  bool ignore_merges = false;  // a word that is itself in the vocab is one token (Llama 3)
  std::optional<int32_t> unk_id;
  std::vector<int32_t> prefix_ids, suffix_ids;  // added around the text by add_special_tokens
  std::optional<int32_t> bos_id, eos_id;
  std::string kind = "bpe (tokenizer.json)";
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeConfig config);  // throws TokenizerError

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  void append_token_bytes(int32_t id, bool skip_special_tokens, bool& at_start,
                          std::string& out) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::optional<std::string> id_to_piece(int32_t id) const override;
  std::optional<int32_t> piece_to_id(std::string_view piece) const override;
  bool is_special(int32_t id) const override;
  std::string kind() const override { return kind_; }

 private:
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;

  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::string> id_to_token_;        // "" for ids no token uses
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::vector<AddedToken> added_by_id_;         // indexed by id; content empty when not added
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> added_to_id_;
  AddedVocab raw_added_, normalized_added_;
  bool nfc_;
  PreTokenizer pre_tokenizer_;
  bool byte_level_decoder_;
  bool ignore_merges_;
  std::optional<int32_t> unk_id_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string kind_;
};

}  // namespace fp8serve
