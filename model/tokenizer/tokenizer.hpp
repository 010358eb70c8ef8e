#pragma once
// The tokenizer interface the engine and server use, and the factories that build one from a
// Hugging Face model directory or from the vocabulary embedded in a GGUF file.
//
// Two implementations: BpeTokenizer (byte-level BPE: tokenizer.json, GGUF "gpt2") and
// SpmTokenizer (SentencePiece: tokenizer.model, GGUF "llama"). Both match added/special token
// strings in the text before the model sees it, as HF tokenizers does, so a chat template's
// "<|im_start|>" becomes one id.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve {

class GgufFile;

// Load-time errors (missing file, malformed JSON, unsupported pre-tokenizer...).
class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // add_special_tokens adds what the tokenizer declares (BOS for Llama/Mistral, nothing for
  // SmolLM/Qwen); special-token strings in `text` are always matched.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;

  // Always valid UTF-8: invalid byte sequences (a token stream cut inside a character) become
  // U+FFFD, as in HF tokenizers. Ids outside the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  // The bytes one token contributes to a decode. `at_start` is true until the first token
  // that produces text; SentencePiece drops the dummy-prefix space of the first piece.
  // Building block of decode() and of IncrementalDetokenizer.
  virtual void append_token_bytes(int32_t id, bool skip_special_tokens, bool& at_start,
                                  std::string& out) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // The token's own string (byte-level or "▁" form for normal tokens, content for special).
  virtual std::optional<std::string> id_to_piece(int32_t id) const = 0;
  virtual std::optional<int32_t> piece_to_id(std::string_view piece) const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // For `fp8serve inspect`: "bpe (tokenizer.json)", "sentencepiece", "bpe (gguf)", "spm (gguf)".
  virtual std::string kind() const = 0;
};

// A Hugging Face model directory: tokenizer.json (byte-level BPE) is preferred, else
// tokenizer.model (SentencePiece); tokenizer_config.json supplies bos/eos and add_bos/add_eos.
std::unique_ptr<Tokenizer> load_tokenizer_dir(const std::filesystem::path& dir);

// Only a tokenizer.json (tokenizer_config.json, if given, for bos/eos names).
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                               const std::filesystem::path& tokenizer_config = {});

// Only a SentencePiece tokenizer.model.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model,
                                              const std::filesystem::path& tokenizer_config = {});

// The vocabulary embedded in a GGUF file: tokenizer.ggml.model "gpt2" (tokens + merges, split
// regex chosen by tokenizer.ggml.pre) or "llama" (tokens + scores + token types).
std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);

}  // namespace fp8serve
