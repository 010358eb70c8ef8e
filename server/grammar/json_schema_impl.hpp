#pragma once
// Internal to json_schema*.cpp: the compiler's state and its parts, split by concern
// (json_schema.cpp: dispatch, $ref, combinators, enum; json_schema_containers.cpp: objects and
// arrays; json_schema_scalars.cpp: strings, numbers).
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/grammar/json_schema.hpp"
#include "server/grammar/json_text.hpp"

namespace fp8serve::grammar {

using Json = nlohmann::ordered_json;

class JsonSchemaCompiler::Impl {
 public:
  Impl(GrammarBuilder& builder, const Json& document, const SchemaLimits& limits)
      : builder_(builder), nfa_(builder.nfa()), document_(document), limits_(limits) {}

  RuleId rule_for(const Json& schema);
  RuleId any_value_rule();
  RuleId any_object_rule();
  RuleId any_array_rule();
  RuleId string_rule();

  // A fragment for one value of `schema`: inline for scalars, a call for containers.
  Frag value(const Json& schema);

 private:
  enum class Kind { object, array };
  struct DepthGuard {
    explicit DepthGuard(Impl& c);
    ~DepthGuard() { --c.depth_; }
    Impl& c;
  };

  // json_schema.cpp
  const Json& resolve_ref(const Json& ref);
  void check_keywords(const Json& schema);
  void require_only_annotations(const Json& schema, const char* combinator,
                                std::initializer_list<const char*> also_allowed = {});
  Frag literals(const Json& schema, const Json* types);
  Frag one_of(const Json& schema, const Json& alternatives, bool exclusive);
  unsigned possible_types(const Json& schema, int depth);
  void check_one_of_disjoint(const Json& alternatives);
  std::vector<std::string> types_of(const Json& schema);
  RuleId container_rule(const Json& schema, Kind kind);

  // json_schema_containers.cpp
  Frag object_body(const Json& schema);
  Frag array_body(const Json& schema);
  Frag key_excluding(const std::vector<std::string>& names);
  Frag any_object_body();
  Frag any_array_body();

  // json_schema_scalars.cpp
  Frag string_value(const Json& schema);
  Frag number_value(const Json& schema, bool integer);
  int64_t count(const Json& schema, const char* keyword, int64_t fallback, int64_t limit);

  GrammarBuilder& builder_;
  Nfa& nfa_;
  const Json& document_;
  SchemaLimits limits_;
  int num_nodes_ = 0;
  int depth_ = 0;
  std::unordered_map<const Json*, RuleId> rules_;
  std::unordered_map<const Json*, RuleId> object_rules_, array_rules_;
  RuleId any_value_ = -1, any_object_ = -1, any_array_ = -1, string_ = -1;
};

}  // namespace fp8serve::grammar
