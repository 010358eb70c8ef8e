// Objects and arrays.
//
// An object's members are written in the schema's property order, each optional one may be
// left out, and commas go only between members that are there. Per position i there are three
// states, "nothing written yet", "something written" and "just after a separator", and one
// shared copy of each member and of each separator:
//
//   first[i] --member_i--> rest[i+1]     (optional: first[i] --> first[i+1])
//   rest[i]  --", "------> pick[i]       (rest[i] may close when every member from i is optional)
//   pick[i]  --member_i--> rest[i+1]     (optional: pick[i]  --> pick[i+1])
//
// Optional members are skipped after the separator, not before it, so the states after a
// value do not carry the whole chain of later members: the determinized object stays small and
// compiles fast even with hundreds of optional properties.
#include <cmath>
#include <map>

#include "model/text/utf8.hpp"
#include "server/grammar/json_schema_impl.hpp"

namespace fp8serve::grammar {

int64_t JsonSchemaCompiler::Impl::count(const Json& schema, const char* keyword, int64_t fallback, int64_t limit) {
  const auto it = schema.find(keyword);
  if (it == schema.end() || it->is_null()) return fallback;
  // Checked as a double first: a count beyond int64 (1e300) must not reach the conversion.
  const double d = it->is_number() ? it->get<double>() : -1.0;
  if (!std::isfinite(d) || d < 0 || std::trunc(d) != d)
    throw GrammarError(std::string("'") + keyword + "' must be a non-negative integer", keyword);
  if (d > static_cast<double>(limit)) {
    const std::string shown = d < 9e18 ? std::to_string(static_cast<int64_t>(d)) : it->dump();
    throw GrammarError(std::string("'") + keyword + "' " + shown + " is above this server's limit of " + std::to_string(limit),
                       keyword);
  }
  return static_cast<int64_t>(d);
}

Frag JsonSchemaCompiler::Impl::key_excluding(const std::vector<std::string>& names) {
  // A character automaton over the trie of the names: a key stays on the trie while it spells
  // a prefix of a name and falls off into `free` when it does not; it may end anywhere except
  // on a whole name.
  CharNfa chars;
  const int32_t free_state = chars.add_state();
  chars.accept = chars.add_state();
  chars.start = chars.add_state();
  chars.sets.push_back(CodepointSet::all());
  chars.edges.push_back({free_state, free_state, 0});
  chars.edges.push_back({free_state, chars.accept, -1});
  std::map<std::string, int32_t> nodes{{"", chars.start}};
  std::map<int32_t, std::vector<char32_t>> children;
  std::map<int32_t, bool> whole;
  for (const std::string& name : names) {
    // Names are valid UTF-8 (they came from JSON): walk them by code point.
    std::string prefix;
    int32_t node = chars.start;
    char32_t cp;
    size_t n;
    for (size_t i = 0; i < name.size(); i += n) {
      if (!utf8::decode(name, i, cp, n)) cp = 0xFFFD;
      prefix += name.substr(i, n);
      auto [it, inserted] = nodes.try_emplace(prefix, -1);
      if (inserted) {
        it->second = chars.add_state();
        chars.sets.push_back(CodepointSet::of(cp));
        chars.edges.push_back({node, it->second, static_cast<int32_t>(chars.sets.size()) - 1});
        children[node].push_back(cp);
      }
      node = it->second;
    }
    whole[node] = true;
  }
  for (const auto& [prefix, node] : nodes) {
    CodepointSet others = CodepointSet::all();
    for (const char32_t cp : children[node]) others = others.minus(CodepointSet::of(cp));
    chars.sets.push_back(others);
    chars.edges.push_back({node, free_state, static_cast<int32_t>(chars.sets.size()) - 1});
    if (!whole[node]) chars.edges.push_back({node, chars.accept, -1});
  }
  return json_string(nfa_, chars, 0, -1);
}

Frag JsonSchemaCompiler::Impl::object_body(const Json& schema) {
  static const Json kEmpty = Json::object();
  const Json& props = schema.contains("properties") ? schema["properties"] : kEmpty;
  if (!props.is_object()) throw GrammarError("'properties' must be an object", "properties");
  std::vector<std::string> required;
  if (const auto r = schema.find("required"); r != schema.end()) {
    if (!r->is_array()) throw GrammarError("'required' must be a list of property names", "required");
    for (const Json& name : *r) {
      if (!name.is_string()) throw GrammarError("'required' must be a list of property names", "required");
      if (std::find(required.begin(), required.end(), name.get<std::string>()) == required.end())
        required.push_back(name.get<std::string>());
    }
  }
  auto is_required = [&](const std::string& n) { return std::find(required.begin(), required.end(), n) != required.end(); };

  struct Member {
    std::string name;
    const Json* schema;
    bool required;
  };
  static const Json kAnything = true;
  std::vector<Member> members;
  for (const auto& [name, sub] : props.items()) members.push_back({name, &sub, is_required(name)});
  for (const std::string& name : required)
    if (!props.contains(name)) members.push_back({name, &kAnything, true});
  if (static_cast<int>(members.size()) > limits_.max_properties)
    throw GrammarError("'properties': an object with " + std::to_string(members.size()) + " properties; at most " +
                           std::to_string(limits_.max_properties) + " are supported",
                       "properties");

  // additionalProperties: absent means none are written when properties are listed (a
  // narrowing), any when the schema lists none ({"type": "object"}).
  const Json* additional = nullptr;
  if (const auto a = schema.find("additionalProperties"); a != schema.end()) {
    if (!(a->is_boolean() && !a->get<bool>())) additional = &*a;
  } else if (props.empty()) {
    additional = &kAnything;
  }
  const int64_t min_props = count(schema, "minProperties", 0, INT32_MAX);
  const int64_t max_props = count(schema, "maxProperties", -1, INT32_MAX);
  int64_t num_required = 0;
  for (const Member& m : members) num_required += m.required ? 1 : 0;
  if (min_props > num_required)
    throw GrammarError("'minProperties' above the number of required properties is not supported; list them in 'required'",
                       "minProperties");
  if (max_props >= 0 && (additional != nullptr || static_cast<int64_t>(members.size()) > max_props))
    throw GrammarError("'maxProperties' below the number of properties that may be written is not supported", "maxProperties");

  Nfa& nfa = nfa_;
  auto member_frag = [&](Frag key, const Json& value_schema) {
    return nfa.seq({key, ws_inline(nfa), nfa.literal(":"), ws_inline(nfa), value(value_schema)});
  };
  auto separator = [&] { return nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa)}); };

  const Frag open = nfa.seq({nfa.literal("{"), ws_break(nfa)});
  const Frag close = nfa.seq({ws_break(nfa), nfa.literal("}")});
  const size_t n = members.size();
  std::vector<int32_t> first(n + 1), rest(n + 1), pick(n + 1);
  for (size_t i = 0; i <= n; ++i) {
    first[i] = nfa.add_state();
    rest[i] = nfa.add_state();
    pick[i] = nfa.add_state();
  }
  // tail_optional[i]: every member from position i on may be left out.
  std::vector<uint8_t> tail_optional(n + 1, 1);
  for (size_t i = n; i-- > 0;) tail_optional[i] = tail_optional[i + 1] && !members[i].required;
  nfa.add_epsilon(open.out, first[0]);
  for (size_t i = 0; i < n; ++i) {
    const Member& m = members[i];
    const bool never = m.schema->is_boolean() && !m.schema->get<bool>();
    if (!never) {
      const Frag member = member_frag(nfa.literal(json_literal_text(Json(m.name))), *m.schema);
      nfa.add_epsilon(first[i], member.in);
      nfa.add_epsilon(pick[i], member.in);
      nfa.add_epsilon(member.out, rest[i + 1]);
    }
    if (!m.required) {
      nfa.add_epsilon(first[i], first[i + 1]);
      nfa.add_epsilon(pick[i], pick[i + 1]);
    }
  }
  for (size_t i = 0; i <= n; ++i) {  // rest[0] is reached only through additional members
    if (i < n || additional != nullptr) {
      const Frag sep = separator();
      nfa.add_epsilon(rest[i], sep.in);
      nfa.add_epsilon(sep.out, pick[i]);
    }
    if (tail_optional[i]) nfa.add_epsilon(rest[i], close.in);
  }
  if (additional != nullptr) {
    std::vector<std::string> names;
    for (const Member& m : members) names.push_back(m.name);
    const Frag extra = member_frag(key_excluding(names), *additional);
    nfa.add_epsilon(first[n], extra.in);
    nfa.add_epsilon(pick[n], extra.in);
    nfa.add_epsilon(extra.out, rest[n]);
  }
  nfa.add_epsilon(first[n], close.in);
  return {open.in, close.out};
}

Frag JsonSchemaCompiler::Impl::array_body(const Json& schema) {
  static const Json kAnything = true;
  std::vector<const Json*> prefix;
  const Json* items = &kAnything;
  const auto items_it = schema.find("items");
  if (const auto p = schema.find("prefixItems"); p != schema.end()) {
    if (!p->is_array()) throw GrammarError("'prefixItems' must be a list of schemas", "prefixItems");
    for (const Json& s : *p) prefix.push_back(&s);
    if (items_it != schema.end()) items = &*items_it;
  } else if (items_it != schema.end() && items_it->is_array()) {
    for (const Json& s : *items_it) prefix.push_back(&s);  // draft-4 tuple form
  } else if (items_it != schema.end()) {
    items = &*items_it;
  }
  if (static_cast<int>(prefix.size()) > limits_.max_items)
    throw GrammarError("more than " + std::to_string(limits_.max_items) + " 'prefixItems'", "prefixItems");
  const int64_t min_items = count(schema, "minItems", 0, limits_.max_items);
  int64_t max_items = count(schema, "maxItems", -1, limits_.max_items);
  const bool no_more = items->is_boolean() && !items->get<bool>();
  if (no_more) max_items = max_items < 0 ? static_cast<int64_t>(prefix.size()) : std::min<int64_t>(max_items, prefix.size());

  Nfa& nfa = nfa_;
  auto item = [&](size_t i) { return nfa.call(rule_for(i < prefix.size() ? *prefix[i] : *items)); };
  const Frag open = nfa.seq({nfa.literal("["), ws_break(nfa)});
  const Frag close = nfa.seq({ws_break(nfa), nfa.literal("]")});
  // Explicit positions up to max_items (or up to where the count no longer matters), then a loop.
  const int64_t explicit_positions = max_items >= 0 ? max_items : std::max<int64_t>(min_items, static_cast<int64_t>(prefix.size()));
  int32_t at = open.out;
  for (int64_t i = 0; i < explicit_positions; ++i) {
    if (i >= min_items) nfa.add_epsilon(at, close.in);
    const Frag next = i == 0 ? item(0) : nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa), item(static_cast<size_t>(i))});
    nfa.add_epsilon(at, next.in);
    at = next.out;
  }
  if (max_items < 0) {
    const Frag more = explicit_positions == 0 ? nfa.optional(nfa.seq({item(prefix.size()), nfa.star(nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa), item(prefix.size())}))}))
                                              : nfa.star(nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa), item(prefix.size())}));
    nfa.add_epsilon(at, more.in);
    at = more.out;
  }
  nfa.add_epsilon(at, close.in);
  return {open.in, close.out};
}

Frag JsonSchemaCompiler::Impl::any_object_body() {
  Nfa& nfa = nfa_;
  auto member = [&] {
    return nfa.seq({nfa.call(string_rule()), ws_inline(nfa), nfa.literal(":"), ws_inline(nfa), nfa.call(any_value_rule())});
  };
  const Frag members = nfa.optional(nfa.seq({member(), nfa.star(nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa), member()}))}));
  return nfa.seq({nfa.literal("{"), ws_break(nfa), members, ws_break(nfa), nfa.literal("}")});
}

Frag JsonSchemaCompiler::Impl::any_array_body() {
  Nfa& nfa = nfa_;
  auto element = [&] { return nfa.call(any_value_rule()); };
  const Frag elements =
      nfa.optional(nfa.seq({element(), nfa.star(nfa.seq({ws_inline(nfa), nfa.literal(","), ws_break(nfa), element()}))}));
  return nfa.seq({nfa.literal("["), ws_break(nfa), elements, ws_break(nfa), nfa.literal("]")});
}

}  // namespace fp8serve::grammar
