#pragma once
// SentencePiece models (Llama 2, TinyLlama, Mistral v0.1) through libsentencepiece, from a
// tokenizer.model or from a GGUF "llama" vocabulary turned into a ModelProto (spm_proto.hpp).
//
// Special-token strings in the text ("<s>", "</s>", "<unk>") are matched first, as HF does for a
// chat template's output; the dummy-prefix space is added only to a text segment that starts
// the text (llama.cpp's rule, and what keeps decode(encode(x)) == x).
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer/added_vocab.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace fp8serve {

struct SpmOptions {
  std::optional<bool> add_bos, add_eos;  // unset: BOS yes, EOS no (Llama's defaults)
  std::optional<std::string> bos_token, eos_token;  // names override the model's own ids
  std::optional<int32_t> bos_id, eos_id;            // ids override names (GGUF)
  std::string kind = "sentencepiece";
};

class SpmTokenizer final : public Tokenizer {
 public:
  // serialized_model: the bytes of a tokenizer.model. Throws TokenizerError.
  SpmTokenizer(const std::string& serialized_model, SpmOptions options);
  ~SpmTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  void append_token_bytes(int32_t id, bool skip_special_tokens, bool& at_start,
                          std::string& out) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }
  std::optional<std::string> id_to_piece(int32_t id) const override;
  std::optional<int32_t> piece_to_id(std::string_view piece) const override;
  bool is_special(int32_t id) const override;
  std::string kind() const override { return kind_; }

 private:
  enum class PieceKind : uint8_t { normal, special, byte, unused };

  std::unique_ptr<sentencepiece::SentencePieceProcessor> with_prefix_;  // the model as given
  std::unique_ptr<sentencepiece::SentencePieceProcessor> no_prefix_;    // dummy prefix off
  bool add_dummy_prefix_;
  std::vector<std::string> pieces_;      // by id
  std::vector<PieceKind> piece_kinds_;   // by id
  AddedVocab specials_;
  bool add_bos_, add_eos_;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string kind_;
};

}  // namespace fp8serve
