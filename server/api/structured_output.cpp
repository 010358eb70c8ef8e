#include "server/api/structured_output.hpp"

#include <spdlog/spdlog.h>

#include <chrono>

#include "server/api/responses.hpp"

namespace fp8serve {

using Json = nlohmann::ordered_json;

StructuredOutputs::StructuredOutputs(std::shared_ptr<const grammar::TokenVocabulary> vocab, grammar::SchemaLimits limits,
                                     size_t max_cached_grammars)
    : vocab_(std::move(vocab)), limits_(limits), capacity_(std::max<size_t>(1, max_cached_grammars)) {}

size_t StructuredOutputs::num_cached() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::variant<GrammarPtr, ApiError> StructuredOutputs::cached(
    const std::string& key, const std::function<grammar::Grammar(const grammar::SchemaLimits&)>& build,
    const std::string& param, const std::string& where) {
  {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  // Compiled outside the lock: two requests racing on one new schema both compile it, and the
  // second result is dropped; nobody waits on another's compile.
  GrammarPtr compiled;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    compiled = std::make_shared<const grammar::CompiledGrammar>(build(limits_), vocab_);
  } catch (const grammar::GrammarError& e) {
    return bad_request(where + ": " + e.what(), param, "invalid_schema");
  }
  spdlog::debug("structured output: compiled {} ({} rules, {} states) in {:.1f} ms", where, compiled->grammar().rules.size(),
                compiled->grammar().total_states(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.first;
  lru_.push_front(key);
  entries_.emplace(key, std::make_pair(compiled, lru_.begin()));
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return compiled;
}

std::variant<GrammarPtr, ApiError> StructuredOutputs::for_response_format(const Json& rf) {
  static const char* kParam = "response_format";
  if (rf.is_null()) return GrammarPtr{};
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return bad_request("'response_format' must be an object with a 'type' (text, json_object or json_schema).", kParam);
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return GrammarPtr{};
  if (type == "json_object")
    return cached("json_object", [](const grammar::SchemaLimits& l) { return grammar::json_object_grammar(l); }, kParam,
                  "response_format json_object");
  if (type != "json_schema")
    return bad_request("'response_format.type' must be text, json_object or json_schema, got '" + type + "'.", kParam);
  const auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    return bad_request("'response_format.json_schema' must be an object with 'name' and 'schema'.", kParam);
  if (const auto name = js->find("name"); name != js->end() && !name->is_string())
    return bad_request("'response_format.json_schema.name' must be a string.", kParam);
  if (const auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean())
    return bad_request("'response_format.json_schema.strict' must be a boolean.", kParam);
  const auto schema = js->find("schema");
  if (schema == js->end() || !(schema->is_object() || schema->is_boolean()))
    return bad_request("'response_format.json_schema.schema' must be a JSON Schema object.", kParam);
  // Always enforced, strict or not: the output matches the schema.
  const Json& document = *schema;
  return cached("schema:" + dump_json(document),
                [&document](const grammar::SchemaLimits& l) { return grammar::json_schema_grammar(document, l); }, kParam,
                "response_format.json_schema.schema");
}

}  // namespace fp8serve
