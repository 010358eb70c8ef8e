#pragma once
// JSON Schema (a subset, listed in docs/structured-outputs.md) compiled to a Grammar whose
// texts are JSON values valid for the schema.
//
// Generation may be narrower than the schema, never wider: properties are written in the
// schema's order; an object schema with `properties` and no `additionalProperties` gets no
// extra properties; whitespace is bounded; numbers have at most 16 integer and 16 fraction
// digits (and no exponent when bounded). Every keyword that would constrain values and that
// we do not enforce is a GrammarError naming it (the API answers 400), never ignored.
//
// Limits (hostile schemas are refused with a GrammarError, or compile in bounded time):
// SchemaLimits below, plus GrammarLimits (automaton states) and RegexLimits (patterns).
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/grammar/grammar.hpp"
#include "server/grammar/regex.hpp"

namespace fp8serve::grammar {

struct SchemaLimits {
  int max_schema_nodes = 10'000;    // subschemas visited
  int max_depth = 32;               // nesting of subschemas
  int max_enum_values = 1'024;      // members of one enum
  int64_t max_enum_bytes = 65'536;  // their JSON text, summed
  int max_items = 256;              // minItems, maxItems, prefixItems
  int max_properties = 256;         // properties of one object (a run of optional ones costs n^2 to compile)
  int max_string_length = 2'048;    // minLength, maxLength
  RegexLimits regex;
  GrammarLimits grammar;
};

// Compiles schemas into one GrammarBuilder. One compiler per schema document: `$ref`s resolve
// against `document` (#, #/$defs/..., #/definitions/..., any local JSON pointer).
class JsonSchemaCompiler {
 public:
  // PRECOND: document and builder outlive the compiler.
  JsonSchemaCompiler(GrammarBuilder& builder, const nlohmann::ordered_json& document, const SchemaLimits& limits);

  // A rule matching the JSON values valid for `schema` (a node inside the document).
  RuleId rule_for(const nlohmann::ordered_json& schema);
  // Any JSON object (response_format json_object).
  RuleId any_object_rule();

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const SchemaLimits& limits = {});
Grammar json_object_grammar(const SchemaLimits& limits = {});

}  // namespace fp8serve::grammar
