#include <algorithm>
#include <cmath>
#include <set>

#include "server/grammar/json_schema_impl.hpp"
#include "server/grammar/number_range.hpp"

namespace fp8serve::grammar {

namespace {

// Keywords that describe but never constrain: accepted and ignored.
const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title",     "description",      "default",         "examples",
                                          "$comment",  "$schema",          "$id",             "deprecated",
                                          "readOnly",  "writeOnly",        "contentMediaType", "contentEncoding",
                                          "$defs",     "definitions",      "nullable",        "discriminator"};
  return k;
}

// Keywords that constrain values and that we do not enforce: always a 400 naming them.
const std::set<std::string>& unsupported() {
  static const std::set<std::string> k = {"multipleOf",       "contains",         "minContains",     "maxContains",
                                          "patternProperties", "propertyNames",   "dependentRequired", "dependentSchemas",
                                          "dependencies",     "if",               "then",            "else",
                                          "not",              "unevaluatedProperties", "unevaluatedItems", "additionalItems",
                                          "$dynamicRef",      "$dynamicAnchor",   "$recursiveRef",   "$recursiveAnchor",
                                          "$anchor"};
  return k;
}

// Every keyword we read, besides the annotations: used to refuse combinations we cannot honour.
const std::set<std::string>& validation_keywords() {
  static const std::set<std::string> k = {
      "type",      "enum",       "const",    "properties", "required", "additionalProperties", "minProperties",
      "maxProperties", "items",  "prefixItems", "minItems", "maxItems", "uniqueItems",        "minLength",
      "maxLength", "pattern",    "format",   "minimum",    "maximum",  "exclusiveMinimum",     "exclusiveMaximum",
      "anyOf",     "oneOf",      "allOf",    "$ref"};
  return k;
}

constexpr unsigned kObject = 1, kArray = 2, kString = 4, kNumber = 8, kBoolean = 16, kNull = 32, kAny = 63;

unsigned type_bit(const std::string& t) {
  if (t == "object") return kObject;
  if (t == "array") return kArray;
  if (t == "string") return kString;
  if (t == "number" || t == "integer") return kNumber;
  if (t == "boolean") return kBoolean;
  if (t == "null") return kNull;
  return 0;
}

unsigned value_bit(const Json& v) {
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_number()) return kNumber;
  if (v.is_boolean()) return kBoolean;
  return kNull;
}

bool value_has_type(const Json& v, const std::string& t) {
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    return v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>();
  }
  return type_bit(t) == value_bit(v) && (t != "number" || v.is_number());
}

std::string pointer_unescape(const std::string& token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size()) {
      out += token[i + 1] == '1' ? '/' : '~';
      ++i;
    } else if (token[i] == '%' && i + 2 < token.size() && std::isxdigit(static_cast<unsigned char>(token[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(token[i + 2]))) {
      out += static_cast<char>(std::stoi(token.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += token[i];
    }
  }
  return out;
}

}  // namespace

JsonSchemaCompiler::JsonSchemaCompiler(GrammarBuilder& builder, const Json& document, const SchemaLimits& limits)
    : impl_(std::make_shared<Impl>(builder, document, limits)) {}

RuleId JsonSchemaCompiler::rule_for(const Json& schema) { return impl_->rule_for(schema); }
RuleId JsonSchemaCompiler::any_object_rule() { return impl_->any_object_rule(); }

JsonSchemaCompiler::Impl::DepthGuard::DepthGuard(Impl& compiler) : c(compiler) {
  if (++c.depth_ > c.limits_.max_depth)
    throw GrammarError("the schema nests deeper than " + std::to_string(c.limits_.max_depth) + " levels");
  if (++c.num_nodes_ > c.limits_.max_schema_nodes)
    throw GrammarError("the schema has more than " + std::to_string(c.limits_.max_schema_nodes) + " subschemas");
}

RuleId JsonSchemaCompiler::Impl::rule_for(const Json& schema) {
  if (auto it = rules_.find(&schema); it != rules_.end()) return it->second;
  const RuleId r = builder_.declare("schema " + std::to_string(rules_.size()));
  rules_.emplace(&schema, r);
  builder_.define(r, value(schema));
  return r;
}

RuleId JsonSchemaCompiler::Impl::any_value_rule() {
  if (any_value_ < 0) {
    any_value_ = builder_.declare("any JSON value");
    const Frag f = nfa_.alt({nfa_.call(any_object_rule()), nfa_.call(any_array_rule()), nfa_.call(string_rule()),
                             json_number(nfa_, {}, {}), nfa_.literal("true"), nfa_.literal("false"), nfa_.literal("null")});
    builder_.define(any_value_, f);
  }
  return any_value_;
}

RuleId JsonSchemaCompiler::Impl::any_object_rule() {
  if (any_object_ < 0) {
    any_object_ = builder_.declare("any JSON object");
    builder_.define(any_object_, any_object_body());
  }
  return any_object_;
}

RuleId JsonSchemaCompiler::Impl::any_array_rule() {
  if (any_array_ < 0) {
    any_array_ = builder_.declare("any JSON array");
    builder_.define(any_array_, any_array_body());
  }
  return any_array_;
}

RuleId JsonSchemaCompiler::Impl::string_rule() {
  if (string_ < 0) {
    string_ = builder_.declare("JSON string");
    builder_.define(string_, json_any_string(nfa_));
  }
  return string_;
}

RuleId JsonSchemaCompiler::Impl::container_rule(const Json& schema, Kind kind) {
  auto& rules = kind == Kind::object ? object_rules_ : array_rules_;
  if (auto it = rules.find(&schema); it != rules.end()) return it->second;
  const RuleId r = builder_.declare(kind == Kind::object ? "object" : "array");
  rules.emplace(&schema, r);
  builder_.define(r, kind == Kind::object ? object_body(schema) : array_body(schema));
  return r;
}

const Json& JsonSchemaCompiler::Impl::resolve_ref(const Json& ref) {
  if (!ref.is_string()) throw GrammarError("'$ref' must be a string", "$ref");
  const std::string& s = ref.get_ref<const std::string&>();
  if (s == "#") return document_;
  if (s.rfind("#/", 0) != 0)
    throw GrammarError("'$ref' " + s + ": only references inside the schema (#, #/$defs/Name, #/...) are supported", "$ref");
  const Json* node = &document_;
  size_t pos = 2;
  while (pos <= s.size()) {
    const size_t slash = s.find('/', pos);
    const std::string token = pointer_unescape(s.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos));
    if (node->is_object() && node->contains(token)) {
      node = &(*node)[token];
    } else if (node->is_array() && !token.empty() && token.find_first_not_of("0123456789") == std::string::npos &&
               token.size() < 10 && std::stoul(token) < node->size()) {
      node = &(*node)[std::stoul(token)];
    } else {
      throw GrammarError("'$ref' " + s + " does not resolve inside the schema", "$ref");
    }
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  return *node;
}

void JsonSchemaCompiler::Impl::check_keywords(const Json& schema) {
  for (const auto& [key, v] : schema.items()) {
    if (unsupported().count(key))
      throw GrammarError("'" + key + "' is not supported by this server's structured outputs", key);
    if (key == "uniqueItems" && v.is_boolean() && v.get<bool>()) {
      const auto max_items = schema.find("maxItems");
      if (max_items == schema.end() || !max_items->is_number() || max_items->get<double>() > 1)
        throw GrammarError("'uniqueItems': true is not supported by this server's structured outputs", key);
    }
  }
}

void JsonSchemaCompiler::Impl::require_only_annotations(const Json& schema, const char* combinator,
                                                        std::initializer_list<const char*> also_allowed) {
  for (const auto& item : schema.items()) {
    const std::string& key = item.key();
    if (key == combinator || annotations().count(key)) continue;
    if (std::find_if(also_allowed.begin(), also_allowed.end(), [&](const char* k) { return key == k; }) != also_allowed.end())
      continue;
    if (!validation_keywords().count(key)) continue;  // unknown keywords are ignored, as validators do
    throw GrammarError("'" + std::string(combinator) + "' together with '" + key +
                           "' in one schema is not supported; move '" + key + "' into the referenced or alternative schemas",
                       key);
  }
}

std::vector<std::string> JsonSchemaCompiler::Impl::types_of(const Json& schema) {
  static const std::set<std::string> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
  std::vector<std::string> out;
  if (const auto it = schema.find("type"); it != schema.end()) {
    const Json list = it->is_array() ? *it : Json::array({*it});
    for (const Json& t : list) {
      if (!t.is_string() || !kTypes.count(t.get<std::string>()))
        throw GrammarError("'type' must name JSON types (object, array, string, number, integer, boolean, null)", "type");
      out.push_back(t.get<std::string>());
    }
    if (out.empty()) throw GrammarError("'type' must not be an empty list", "type");
    // integer values are numbers: a list naming both needs only "number".
    if (std::count(out.begin(), out.end(), "number") && std::count(out.begin(), out.end(), "integer"))
      out.erase(std::remove(out.begin(), out.end(), std::string("integer")), out.end());
    return out;
  }
  auto has_any = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return schema.contains(k); });
  };
  if (has_any({"properties", "required", "additionalProperties", "minProperties", "maxProperties"})) out.push_back("object");
  if (has_any({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})) out.push_back("array");
  if (has_any({"minLength", "maxLength", "pattern", "format"})) out.push_back("string");
  if (has_any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) out.push_back("number");
  return out;  // empty: any value
}

Frag JsonSchemaCompiler::Impl::value(const Json& schema) {
  DepthGuard guard(*this);
  if (schema.is_boolean()) return schema.get<bool>() ? nfa_.call(any_value_rule()) : nfa_.nothing();
  if (!schema.is_object()) throw GrammarError("a schema must be an object or a boolean, got " + std::string(schema.type_name()));
  check_keywords(schema);
  if (const auto ref = schema.find("$ref"); ref != schema.end()) {
    require_only_annotations(schema, "$ref");
    return nfa_.call(rule_for(resolve_ref(*ref)));
  }
  if (const auto all = schema.find("allOf"); all != schema.end()) {
    if (!all->is_array() || all->size() != 1)
      throw GrammarError("'allOf' with more than one schema is not supported; merge them into one schema", "allOf");
    require_only_annotations(schema, "allOf");
    return value((*all)[0]);
  }
  if (const auto any = schema.find("anyOf"); any != schema.end()) {
    require_only_annotations(schema, "anyOf");
    return one_of(schema, *any, false);
  }
  if (const auto one = schema.find("oneOf"); one != schema.end()) {
    require_only_annotations(schema, "oneOf");
    return one_of(schema, *one, true);
  }
  const auto type = schema.find("type");
  if (schema.contains("const") || schema.contains("enum")) return literals(schema, type == schema.end() ? nullptr : &*type);

  const std::vector<std::string> types = types_of(schema);
  if (types.empty()) return nfa_.call(any_value_rule());
  std::vector<Frag> alts;
  for (const std::string& t : types) {
    if (t == "object") alts.push_back(nfa_.call(container_rule(schema, Kind::object)));
    else if (t == "array") alts.push_back(nfa_.call(container_rule(schema, Kind::array)));
    else if (t == "string") alts.push_back(string_value(schema));
    else if (t == "number") alts.push_back(number_value(schema, false));
    else if (t == "integer") alts.push_back(number_value(schema, true));
    else if (t == "boolean") alts.push_back(nfa_.alt({nfa_.literal("true"), nfa_.literal("false")}));
    else alts.push_back(nfa_.literal("null"));
  }
  return nfa_.alt(alts);
}

Frag JsonSchemaCompiler::Impl::literals(const Json& schema, const Json* type) {
  for (const auto& [key, v] : schema.items())
    if (key != "const" && key != "enum" && key != "type" && validation_keywords().count(key))
      throw GrammarError("'enum'/'const' together with '" + key + "' is not supported; list only the allowed values", key);
  Json values = Json::array();
  if (const auto c = schema.find("const"); c != schema.end()) {
    values.push_back(*c);
  } else {
    const Json& e = schema["enum"];
    if (!e.is_array()) throw GrammarError("'enum' must be a list", "enum");
    if (static_cast<int>(e.size()) > limits_.max_enum_values)
      throw GrammarError("'enum' has " + std::to_string(e.size()) + " values; at most " + std::to_string(limits_.max_enum_values) +
                             " are supported",
                         "enum");
    values = e;
  }
  std::vector<std::string> types;
  if (type != nullptr) types = types_of(schema);
  std::vector<Frag> alts;
  int64_t bytes = 0;
  for (const Json& v : values) {
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& t) { return value_has_type(v, t); }))
      continue;
    const std::string text = json_literal_text(v);
    bytes += static_cast<int64_t>(text.size());
    if (bytes > limits_.max_enum_bytes)
      throw GrammarError("'enum' values exceed " + std::to_string(limits_.max_enum_bytes) + " bytes of JSON", "enum");
    alts.push_back(nfa_.literal(text));
  }
  return nfa_.alt(alts);
}

Frag JsonSchemaCompiler::Impl::one_of(const Json&, const Json& alternatives, bool exclusive) {
  const char* keyword = exclusive ? "oneOf" : "anyOf";
  if (!alternatives.is_array() || alternatives.empty())
    throw GrammarError(std::string("'") + keyword + "' must be a non-empty list of schemas", keyword);
  if (exclusive) check_one_of_disjoint(alternatives);
  std::vector<Frag> alts;
  for (const Json& a : alternatives) alts.push_back(value(a));
  return nfa_.alt(alts);
}

unsigned JsonSchemaCompiler::Impl::possible_types(const Json& schema, int depth) {
  if (depth > 16) return kAny;
  if (schema.is_boolean()) return schema.get<bool>() ? kAny : 0;
  if (!schema.is_object()) return kAny;
  if (const auto ref = schema.find("$ref"); ref != schema.end()) return possible_types(resolve_ref(*ref), depth + 1);
  if (const auto c = schema.find("const"); c != schema.end()) return value_bit(*c);
  if (const auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    unsigned bits = 0;
    for (const Json& v : *e) bits |= value_bit(v);
    return bits;
  }
  for (const char* combinator : {"anyOf", "oneOf", "allOf"})
    if (const auto alts = schema.find(combinator); alts != schema.end() && alts->is_array()) {
      unsigned bits = 0;
      for (const Json& a : *alts) bits |= possible_types(a, depth + 1);
      return bits;
    }
  const std::vector<std::string> types = types_of(schema);
  if (types.empty()) return kAny;
  unsigned bits = 0;
  for (const std::string& t : types) bits |= type_bit(t);
  return bits;
}

void JsonSchemaCompiler::Impl::check_one_of_disjoint(const Json& alternatives) {
  std::vector<unsigned> bits;
  for (const Json& a : alternatives) bits.push_back(possible_types(a, 0));
  bool disjoint = true;
  for (size_t i = 0; i < bits.size(); ++i)
    for (size_t j = i + 1; j < bits.size(); ++j) disjoint &= (bits[i] & bits[j]) == 0;
  if (disjoint) return;
  // A discriminated union: object alternatives that each require one property whose allowed
  // values (const / enum) differ between alternatives.
  std::vector<const Json*> objects;
  for (const Json& a : alternatives) {
    const Json* s = &a;
    for (int hops = 0; hops < 16 && s->is_object() && s->contains("$ref"); ++hops) s = &resolve_ref((*s)["$ref"]);
    if (!s->is_object() || !s->contains("properties") || !(*s)["properties"].is_object() || !s->contains("required") ||
        !(*s)["required"].is_array())
      objects.clear();
    else
      objects.push_back(s);
    if (objects.empty()) break;
  }
  if (objects.size() == alternatives.size()) {
    for (const auto& [name, unused] : (*objects[0])["properties"].items()) {
      std::vector<Json> values;
      bool ok = true;
      for (const Json* o : objects) {
        const Json& required = (*o)["required"];
        const Json& props = (*o)["properties"];
        if (std::find(required.begin(), required.end(), Json(name)) == required.end() || !props.contains(name)) {
          ok = false;
          break;
        }
        const Json* p = &props[name];
        for (int hops = 0; hops < 16 && p->is_object() && p->contains("$ref"); ++hops) p = &resolve_ref((*p)["$ref"]);
        if (!p->is_object()) ok = false;
        else if (p->contains("const")) values.push_back(Json::array({(*p)["const"]}));
        else if (p->contains("enum") && (*p)["enum"].is_array()) values.push_back((*p)["enum"]);
        else ok = false;
        if (!ok) break;
      }
      for (size_t i = 0; ok && i < values.size(); ++i)
        for (size_t j = i + 1; ok && j < values.size(); ++j)
          for (const Json& x : values[i])
            if (std::find(values[j].begin(), values[j].end(), x) != values[j].end()) ok = false;
      if (ok) return;
    }
  }
  throw GrammarError(
      "'oneOf' alternatives may match the same value, so a value valid for one could be rejected; use 'anyOf', or make the "
      "alternatives disjoint (different types, or a required property with a different 'const' in each)",
      "oneOf");
}

Grammar json_schema_grammar(const Json& schema, const SchemaLimits& limits) {
  GrammarBuilder builder(limits.grammar);
  JsonSchemaCompiler compiler(builder, schema, limits);
  const RuleId root = compiler.rule_for(schema);
  return builder.build(root);
}

Grammar json_object_grammar(const SchemaLimits& limits) {
  GrammarBuilder builder(limits.grammar);
  const Json empty = Json::object();
  JsonSchemaCompiler compiler(builder, empty, limits);
  const RuleId root = compiler.any_object_rule();
  return builder.build(root);
}

}  // namespace fp8serve::grammar
