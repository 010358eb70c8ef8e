#pragma once
// Shared by the grammar tests: a byte vocabulary (token i writes byte i, token 256 is the end
// token) so that texts can be fed byte by byte, and one-line compile helpers.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/grammar/json_schema.hpp"
#include "model/grammar/matcher.hpp"

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
