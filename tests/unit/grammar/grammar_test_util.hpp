#pragma once
// Shared by the grammar tests: a byte vocabulary (token i writes byte i, token 256 is the end
// token) so that texts can be fed byte by byte, and one-line compile helpers.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/grammar/json_schema.hpp"
#include "server/grammar/matcher.hpp"

namespace fp8serve::grammar::test {

using Json = nlohmann::ordered_json;

inline std::shared_ptr<const TokenVocabulary> byte_vocab() {
  static const auto vocab = [] {
    std::vector<std::string> bytes(257);
    std::vector<uint8_t> usable(257, 1);
    for (int b = 0; b < 256; ++b) bytes[static_cast<size_t>(b)] = std::string(1, static_cast<char>(b));
    usable[256] = 0;
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(usable), std::vector<int32_t>{256}, 257);
  }();
  return vocab;
}

// Every byte, plus substrings (1-6 bytes) of JSON texts, plus fragments of multi-byte
// characters, plus two special tokens and an end token.
inline std::shared_ptr<const TokenVocabulary> synthetic_vocab() {
  std::set<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.insert(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> texts = {
      R"({"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true, "v": null})",
      "{\n  \"id\": -12.5e3,\n  \"s\": \"caf\xC3\xA9 \xF0\x9F\x98\x80 \\\"q\\\" \\u00e9\"\n}",
      R"([{"kind": "cat", "lives": 9}, {"kind": "dog"}])", R"(2024-06-01T12:30:00Z 123e4567-e89b)"};
  for (const std::string& t : texts)
    for (size_t i = 0; i < t.size(); ++i)
      for (size_t n = 2; n <= 6 && i + n <= t.size(); ++n) pieces.insert(t.substr(i, n));
  std::vector<std::string> bytes(pieces.begin(), pieces.end());
  std::vector<uint8_t> usable(bytes.size(), 1);
  bytes.push_back("<|special|>");
  usable.push_back(0);
  bytes.push_back("");  // an id the tokenizer does not define
  usable.push_back(1);
  bytes.push_back("<eos>");
  usable.push_back(0);
  const auto eos = static_cast<int32_t>(bytes.size()) - 1;
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(usable), std::vector<int32_t>{eos},
                                                 eos + 7);  // padded like a model's embedding
}

inline std::shared_ptr<const CompiledGrammar> compile(const Json& schema, std::shared_ptr<const TokenVocabulary> vocab = byte_vocab()) {
  return std::make_shared<const CompiledGrammar>(json_schema_grammar(schema), std::move(vocab));
}

inline std::shared_ptr<const CompiledGrammar> compile(const char* schema_text) { return compile(Json::parse(schema_text)); }
inline std::shared_ptr<const CompiledGrammar> compile(const std::string& schema_text) { return compile(Json::parse(schema_text)); }

// The whole text is a complete value of the grammar.
inline bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// The GrammarError keyword a schema's compilation reports ("" when it compiles).
inline std::string error_keyword(const std::string& schema_text) {
  try {
    json_schema_grammar(Json::parse(schema_text));
  } catch (const GrammarError& e) {
    return e.keyword().empty() ? std::string("<none>: ") + e.what() : e.keyword();
  }
  return "";
}

}  // namespace fp8serve::grammar::test
