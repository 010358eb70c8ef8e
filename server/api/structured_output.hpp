#pragma once
// Structured outputs for the API: response_format ({"type": "json_object"} and
// {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}) turned into compiled
// grammars for the engine, and a cache of compiled grammars shared by every request (so a
// schema is compiled once, and the token-mask classifications computed for it are reused by
// every later request with the same schema).
//
// Compiling happens on the HTTP thread that parses the request; every failure is a 400 that
// names the parameter and, inside a schema, the keyword (GrammarError).
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"
#include "server/grammar/compiled_grammar.hpp"
#include "server/grammar/json_schema.hpp"

namespace fp8serve {

using GrammarPtr = std::shared_ptr<const grammar::CompiledGrammar>;

class StructuredOutputs {
 public:
  StructuredOutputs(std::shared_ptr<const grammar::TokenVocabulary> vocab, grammar::SchemaLimits limits = {},
                    size_t max_cached_grammars = 256);

  // null for {"type": "text"}; a grammar for json_object / json_schema; a 400 otherwise.
  std::variant<GrammarPtr, ApiError> for_response_format(const nlohmann::ordered_json& response_format);

  // The grammar `build` makes, compiled once per `key` and cached. A GrammarError becomes a 400
  // whose message starts with `where` and whose param is `param`.
  std::variant<GrammarPtr, ApiError> cached(const std::string& key,
                                            const std::function<grammar::Grammar(const grammar::SchemaLimits&)>& build,
                                            const std::string& param, const std::string& where);

  const grammar::TokenVocabulary& vocab() const { return *vocab_; }
  size_t num_cached() const;

 private:
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  grammar::SchemaLimits limits_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::string> lru_;  // most recent first
  std::unordered_map<std::string, std::pair<GrammarPtr, std::list<std::string>::iterator>> entries_;
};

}  // namespace fp8serve
