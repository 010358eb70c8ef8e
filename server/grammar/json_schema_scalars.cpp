// Strings (length, pattern, format) and numbers (bounds).
#include "server/grammar/json_schema_impl.hpp"
#include "server/grammar/number_range.hpp"

namespace fp8serve::grammar {

Frag JsonSchemaCompiler::Impl::string_value(const Json& schema) {
  const int64_t min_length = count(schema, "minLength", 0, limits_.max_string_length);
  const int64_t max_length = count(schema, "maxLength", -1, limits_.max_string_length);
  const auto pattern = schema.find("pattern");
  const auto format = schema.find("format");
  if (pattern != schema.end() && format != schema.end())
    throw GrammarError("'pattern' together with 'format' is not supported; use one of them", "format");
  if (pattern != schema.end()) {
    if (!pattern->is_string()) throw GrammarError("'pattern' must be a string", "pattern");
    return json_string(nfa_, compile_regex(pattern->get<std::string>(), limits_.regex, "pattern"), min_length, max_length);
  }
  if (format != schema.end()) {
    if (!format->is_string()) throw GrammarError("'format' must be a string", "format");
    const std::string_view regex = format_regex(format->get<std::string>());
    if (regex.empty())
      throw GrammarError("'format': \"" + format->get<std::string>() +
                             "\" is not supported (supported: date-time, date, time, uuid, email, ipv4, hostname, uri)",
                         "format");
    return json_string(nfa_, compile_regex(regex, limits_.regex, "format"), min_length, max_length);
  }
  if (min_length == 0 && max_length < 0) return nfa_.call(string_rule());
  return json_any_string(nfa_, min_length, max_length);
}

Frag JsonSchemaCompiler::Impl::number_value(const Json& schema, bool integer) {
  auto bound = [&](const char* keyword, bool exclusive) -> NumberBound {
    const auto it = schema.find(keyword);
    if (it == schema.end() || it->is_null()) return {};
    if (!it->is_number()) throw GrammarError(std::string("'") + keyword + "' must be a number", keyword);
    return parse_bound(json_literal_text(*it), exclusive, keyword);
  };
  NumberBound lo = bound("minimum", false), hi = bound("maximum", false);
  // exclusiveMinimum: a number (2019+), or true next to minimum (draft 4).
  for (const auto& [keyword, side, plain] : {std::tuple{"exclusiveMinimum", &lo, "minimum"}, std::tuple{"exclusiveMaximum", &hi, "maximum"}}) {
    const auto it = schema.find(keyword);
    if (it == schema.end() || it->is_null()) continue;
    if (it->is_boolean()) {
      if (it->get<bool>()) side->exclusive = side->present;
      (void)plain;
      continue;
    }
    NumberBound b = bound(keyword, true);
    // With both given, the tighter bound wins; compare through doubles, exact enough here
    // since both came from the same schema text.
    if (!side->present) {
      *side = b;
    } else {
      const double x = it->get<double>(), y = schema[plain].get<double>();
      const bool tighter = side == &lo ? x >= y : x <= y;
      if (tighter) *side = b;
    }
  }
  return integer ? json_integer(nfa_, lo, hi) : json_number(nfa_, lo, hi);
}

}  // namespace fp8serve::grammar
