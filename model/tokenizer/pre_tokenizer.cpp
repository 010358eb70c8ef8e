#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer/pre_tokenizer.hpp"

#include <pcre2.h>

#include <array>
#include <nlohmann/json.hpp>

#include "model/text/utf8.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace fp8serve {
namespace {

struct ByteMap {
  std::array<char32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // the map's code points are all below 0x144
  ByteMap() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    for (int b = 0; b < 256; ++b) to_byte[to_unicode[static_cast<std::size_t>(b)]] = static_cast<int16_t>(b);
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;  // immutable table, built once
  return map;
}

using Span = std::pair<std::size_t, std::size_t>;

// HF's SplitDelimiterBehavior over the pieces between and at the matches.
std::vector<Span> apply_behavior(std::string_view text, const std::vector<Span>& matches,
                                 SplitBehavior behavior, bool invert) {
  std::vector<std::pair<Span, bool>> parts;  // (span, is_match)
  std::size_t prev = 0;
  for (const auto& m : matches) {
    if (m.first > prev) parts.push_back({{prev, m.first}, invert});
    parts.push_back({m, !invert});
    prev = m.second;
  }
  if (prev < text.size()) parts.push_back({{prev, text.size()}, invert});

  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const auto& [s, is_match] : parts) out.push_back(s);
      break;
    case SplitBehavior::removed:
      for (const auto& [s, is_match] : parts) {
        if (!is_match) out.push_back(s);
      }
      break;
    case SplitBehavior::merged_with_previous: {
      bool prev_match = false;
      for (const auto& [s, is_match] : parts) {
        if (is_match && !out.empty() && !prev_match) {
          out.back().second = s.second;
        } else {
          out.push_back(s);
        }
        prev_match = is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool pending = false;
      for (const auto& [s, is_match] : parts) {
        if (pending && !is_match) {  // a run of matches: only the last one joins the text after it
          out.back().second = s.second;
          pending = false;
          continue;
        }
        out.push_back(s);
        pending = is_match;
      }
      break;
    }
    case SplitBehavior::contiguous: {
      // Runs of parts with the same flag merge (with invert, runs of adjacent matches too).
      bool prev_match = false;
      for (const auto& [s, is_match] : parts) {
        if (is_match == prev_match && !out.empty()) {
          out.back().second = s.second;
        } else {
          out.push_back(s);
        }
        prev_match = is_match;
      }
      break;
    }
  }
  return out;
}

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  throw TokenizerError("tokenizer.json: Split behavior \"" + s + "\" is not supported");
}

void parse_pre_tokenizer(const nlohmann::json& j, std::vector<PreTokenizerStep>& steps) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    throw TokenizerError("tokenizer.json: pre_tokenizer has no \"type\"");
  }
  const std::string type = j["type"].get<std::string>();
  PreTokenizerStep step;
  if (type == "Sequence" && j.contains("pretokenizers") && j["pretokenizers"].is_array()) {
    for (const nlohmann::json& p : j["pretokenizers"]) parse_pre_tokenizer(p, steps);
    return;
  }
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::byte_level;
    step.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) step.regex = std::make_shared<SplitRegex>(kGpt2SplitRegex, false);
  } else if (type == "Split") {
    const nlohmann::json& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      step.regex = std::make_shared<SplitRegex>(pattern["Regex"].get<std::string>(), false);
    } else if (pattern.contains("String")) {
      step.regex = std::make_shared<SplitRegex>(pattern["String"].get<std::string>(), true);
    } else {
      throw TokenizerError("tokenizer.json: Split pattern is neither Regex nor String");
    }
    step.behavior = parse_behavior(j.value("behavior", std::string("Isolated")));
    step.invert = j.value("invert", false);
  } else if (type == "Digits") {
    // Rust's char::is_numeric is \p{N}; runs stay together unless individual_digits.
    step.regex = std::make_shared<SplitRegex>(j.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", false);
  } else {
    throw TokenizerError("tokenizer.json: pre-tokenizer \"" + type +
                         "\" is not supported (byte-level BPE: ByteLevel, Split, Digits, Sequence)");
  }
  steps.push_back(std::move(step));
}

}  // namespace

char32_t byte_to_unicode(unsigned char b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(char32_t cp) { return cp < 324 ? byte_map().to_byte[cp] : -1; }

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append(out, byte_to_unicode(static_cast<unsigned char>(c)));
  return out;
}

SplitRegex::SplitRegex(std::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL refuses UCP
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                        &error, &offset, nullptr);
  if (!code_) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw TokenizerError("tokenizer: bad split regex at offset " + std::to_string(offset) + ": " +
                         reinterpret_cast<const char*>(message) + " in /" + std::string(pattern) + "/");
  }
  // JIT is an optimisation only: the interpreter gives the same matches where it is missing.
  pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE);
}

SplitRegex::~SplitRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<std::size_t, std::size_t>> SplitRegex::find_all(std::string_view text) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    // NO_UTF_CHECK: the caller guarantees valid UTF-8 (encode() repairs its input first).
    int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // the interpreter keeps its backtracking on the heap
      rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.get(), nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw TokenizerError(std::string("tokenizer: regex match failed: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
    std::size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match: step over one code point so the scan advances
      char32_t cp;
      std::size_t len;
      utf8::decode(text, begin, cp, len);
      pos = begin + len;
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
  }
  return out;
}

bool PreTokenizer::has_byte_level() const {
  for (const auto& s : steps_) {
    if (s.kind == PreTokenizerStep::Kind::byte_level) return true;
  }
  return false;
}

std::vector<std::string> PreTokenizer::run(std::string_view text) const {
  std::vector<std::string> words{std::string(text)};
  for (const auto& step : steps_) {
    std::vector<std::string> next;
    next.reserve(words.size() * 2);
    for (const std::string& word : words) {
      std::string w = word;
      if (step.kind == PreTokenizerStep::Kind::byte_level && step.add_prefix_space && !w.empty() && !w.starts_with(' ')) {
        w.insert(w.begin(), ' ');
      }
      std::vector<Span> spans;
      if (step.regex) {
        spans = apply_behavior(w, step.regex->find_all(w),
                               step.kind == PreTokenizerStep::Kind::byte_level ? SplitBehavior::isolated : step.behavior,
                               step.kind == PreTokenizerStep::Kind::byte_level ? false : step.invert);
      } else {
        spans.push_back({0, w.size()});
      }
      for (const auto& [b, e] : spans) {
        if (e == b) continue;
        std::string_view piece = std::string_view(w).substr(b, e - b);
        next.push_back(step.kind == PreTokenizerStep::Kind::byte_level ? byte_level_encode(piece) : std::string(piece));
      }
    }
    words = std::move(next);
  }
  return words;
}

std::vector<PreTokenizerStep> parse_pre_tokenizer_json(const nlohmann::json& j) {
  std::vector<PreTokenizerStep> steps;
  try {
    parse_pre_tokenizer(j, steps);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(std::string("tokenizer.json: pre_tokenizer: ") + e.what());
  }
  return steps;
}

}  // namespace fp8serve
