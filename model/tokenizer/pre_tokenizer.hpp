#pragma once
// Pre-tokenization for byte-level BPE: the split regexes (PCRE2 with UTF + UCP, so \p{L}, \s
// and look-ahead behave as in HF's Oniguruma patterns), HF's Split behaviours, Digits, and the
// ByteLevel step that maps every byte to GPT-2's printable characters.
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8serve {

// Split patterns of the model families we know (tokenizer.json spells them out; GGUF names
// them by tokenizer.ggml.pre).
inline constexpr std::string_view kGpt2SplitRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A compiled PCRE2 pattern (JIT where available). Immutable after construction, so one
// instance serves every thread; match data is per call.
class SplitRegex {
 public:
  // literal: the pattern is a plain string (HF's {"String": ...}). Throws TokenizerError.
  SplitRegex(std::string_view pattern, bool literal);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Non-overlapping matches [begin, end), left to right. PRECOND: text is valid UTF-8.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct PreTokenizerStep {
  enum class Kind { split, byte_level } kind = Kind::split;
  std::shared_ptr<const SplitRegex> regex;  // split; byte_level with use_regex
  SplitBehavior behavior = SplitBehavior::isolated;
  bool invert = false;
  bool add_prefix_space = false;  // byte_level
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Splits one normalized text fragment into the words the BPE model encodes (byte-level
  // mapped when a ByteLevel step is present).
  std::vector<std::string> run(std::string_view text) const;
  bool has_byte_level() const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

// HF's "pre_tokenizer" object (null: no steps). Throws TokenizerError naming what is unsupported.
std::vector<PreTokenizerStep> parse_pre_tokenizer_json(const nlohmann::json& j);

// GPT-2's reversible byte <-> printable code point map.
char32_t byte_to_unicode(unsigned char b);
int unicode_to_byte(char32_t cp);  // -1 when cp is not in the map
std::string byte_level_encode(std::string_view bytes);

}  // namespace fp8serve
