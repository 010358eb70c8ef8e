// The vocabulary embedded in a GGUF file -> the same tokenizer types as a model directory gives:
// "gpt2" -> BpeTokenizer (tokens + merges; the split regex chosen by tokenizer.ggml.pre),
// "llama" -> SpmTokenizer (tokens + scores + token types, rebuilt as a SentencePiece model).
#include <algorithm>

#include "model/formats/gguf.hpp"
#include "model/tokenizer/bpe_tokenizer.hpp"
#include "model/tokenizer/spm_proto.hpp"
#include "model/tokenizer/spm_tokenizer.hpp"

namespace fp8serve {
namespace {

// How each tokenizer.ggml.pre value pre-tokenizes, matching the tokenizer.json the model was
// converted from (and the one transformers rebuilds from the GGUF).
struct PreStyle {
  std::string_view name;
  std::string_view regex;  // empty: ByteLevel's own GPT-2 regex
  bool nfc;
  bool ignore_merges;
};
constexpr PreStyle kPreStyles[] = {
    {"gpt-2", "", false, false},
    {"smollm", "", false, false},
    {"starcoder", "", false, false},
    {"refact", "", false, false},
    {"llama-bpe", kLlama3SplitRegex, false, true},
    {"llama3", kLlama3SplitRegex, false, true},
    {"smaug-bpe", kLlama3SplitRegex, false, true},
    {"qwen2", kQwen2SplitRegex, true, false},
    {"deepseek-r1-qwen", kQwen2SplitRegex, true, false},
};

std::optional<int32_t> token_id(const GgufFile& g, std::string_view key, std::size_t num_tokens) {
  const auto v = g.get_int(key);
  if (!v) return std::nullopt;
  if (*v < 0 || static_cast<uint64_t>(*v) >= num_tokens) {
    throw TokenizerError("GGUF " + std::string(key) + " = " + std::to_string(*v) + " is outside the vocabulary");
  }
  return static_cast<int32_t>(*v);
}

std::unique_ptr<Tokenizer> gpt2_from_gguf(const GgufFile& g, std::vector<std::string> tokens,
                                          const std::vector<int64_t>& types) {
  const std::string pre = g.get_string("tokenizer.ggml.pre").value_or("default");
  const auto style = std::find_if(std::begin(kPreStyles), std::end(kPreStyles),
                                  [&](const PreStyle& s) { return s.name == pre; });
  if (style == std::end(kPreStyles)) {
    throw TokenizerError("GGUF tokenizer.ggml.pre \"" + pre +
                         "\" is not supported (known: gpt-2, smollm, starcoder, refact, llama-bpe, llama3, "
                         "smaug-bpe, qwen2, deepseek-r1-qwen)");
  }
  BpeConfig config;
  config.kind = "bpe (gguf)";
  config.nfc = style->nfc;
  config.ignore_merges = style->ignore_merges;
  if (style->regex.empty()) {
    config.pre_tokenizer.push_back({PreTokenizerStep::Kind::byte_level,
                                    std::make_shared<SplitRegex>(kGpt2SplitRegex, false)});
  } else {
    config.pre_tokenizer.push_back({PreTokenizerStep::Kind::split, std::make_shared<SplitRegex>(style->regex, false)});
    config.pre_tokenizer.push_back({PreTokenizerStep::Kind::byte_level, nullptr});
  }
  for (const std::string& m : g.get_string_array("tokenizer.ggml.merges")) {
    const auto space = m.find(' ', 1);
    if (space == std::string::npos) throw TokenizerError("GGUF tokenizer.ggml.merges: malformed merge \"" + m + "\"");
    config.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  // Control tokens (type 3) are special; user-defined ones (4) are matched in text but kept
  // by skip_special_tokens, as transformers' GGUF conversion does.
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int64_t type = types.empty() ? 1 : types[i];
    if (type == 3 || type == 4) {
      config.added_tokens.push_back({tokens[i], static_cast<int32_t>(i), type == 3});
    }
    config.vocab.emplace_back(std::move(tokens[i]), static_cast<int32_t>(i));
  }
  config.bos_id = token_id(g, "tokenizer.ggml.bos_token_id", config.vocab.size());
  config.eos_id = token_id(g, "tokenizer.ggml.eos_token_id", config.vocab.size());
  config.unk_id = std::nullopt;  // byte-level: every byte has a token
  if (g.get_bool("tokenizer.ggml.add_bos_token").value_or(false) && config.bos_id) config.prefix_ids = {*config.bos_id};
  if (g.get_bool("tokenizer.ggml.add_eos_token").value_or(false) && config.eos_id) config.suffix_ids = {*config.eos_id};
  return std::make_unique<BpeTokenizer>(std::move(config));
}

std::unique_ptr<Tokenizer> llama_from_gguf(const GgufFile& g, std::vector<std::string> tokens,
                                           const std::vector<int64_t>& types) {
  const std::vector<double> scores = g.get_float_array("tokenizer.ggml.scores");
  if (!scores.empty() && scores.size() != tokens.size()) {
    throw TokenizerError("GGUF tokenizer.ggml.scores has " + std::to_string(scores.size()) + " entries for " +
                         std::to_string(tokens.size()) + " tokens");
  }
  SpmModelSpec spec;
  spec.unk_id = -1;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int64_t type = types.empty() ? 1 : types[i];
    if (type < 1 || type > 6) throw TokenizerError("GGUF tokenizer.ggml.token_type " + std::to_string(type) + " is not a SentencePiece type");
    if (type == 6) spec.byte_fallback = true;
    if (type == 2 && spec.unk_id < 0) spec.unk_id = static_cast<int>(i);
    spec.pieces.push_back({std::move(tokens[i]), scores.empty() ? 0.0f : static_cast<float>(scores[i]),
                           static_cast<SpmPieceType>(type)});
  }
  if (spec.unk_id < 0) throw TokenizerError("GGUF llama vocabulary has no unknown token (token_type 2)");
  const auto bos = token_id(g, "tokenizer.ggml.bos_token_id", spec.pieces.size());
  const auto eos = token_id(g, "tokenizer.ggml.eos_token_id", spec.pieces.size());
  spec.bos_id = bos.value_or(-1);
  spec.eos_id = eos.value_or(-1);
  spec.add_dummy_prefix = g.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  SpmOptions options;
  options.add_bos = g.get_bool("tokenizer.ggml.add_bos_token").value_or(true);
  options.add_eos = g.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  options.bos_id = bos;
  options.eos_id = eos;
  options.kind = "spm (gguf)";
  return std::make_unique<SpmTokenizer>(spm_build_model_proto(spec), std::move(options));
}

}  // namespace

std::unique_ptr<Tokenizer> from_gguf(const GgufFile& g) {
  try {
    const auto model = g.get_string("tokenizer.ggml.model");
    if (!model) throw TokenizerError("GGUF has no tokenizer (tokenizer.ggml.model is missing)");
    std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
    if (tokens.empty()) throw TokenizerError("GGUF tokenizer.ggml.tokens is missing or empty");
    if (tokens.size() >= (1u << 24)) throw TokenizerError("GGUF tokenizer.ggml.tokens is implausibly large");
    const std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
    if (!types.empty() && types.size() != tokens.size()) {
      throw TokenizerError("GGUF tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " +
                           std::to_string(tokens.size()) + " tokens");
    }
    if (*model == "gpt2") return gpt2_from_gguf(g, std::move(tokens), types);
    if (*model == "llama") return llama_from_gguf(g, std::move(tokens), types);
    throw TokenizerError("GGUF tokenizer.ggml.model \"" + *model + "\" is not supported (gpt2, llama)");
  } catch (const FormatError& e) {
    throw TokenizerError(std::string("GGUF tokenizer: ") + e.what());
  }
}

}  // namespace fp8serve
