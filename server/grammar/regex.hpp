#pragma once
// JSON Schema `pattern` (and the `format`s we enforce) as a character automaton (CharNfa), to
// be written out as JSON string contents by json_string().
//
// The subset: literals, `.`, classes `[a-z]` `[^...]`, escapes \d \w \s \D \W \S \t \n \r \f \v
// \xHH \uHHHH and escaped punctuation, groups `( )` `(?: )`, alternation `|`, quantifiers
// `* + ? {n} {n,} {n,m}` (a trailing `?` for laziness is accepted and means nothing here),
// and the anchors `^` at the start and `$` at the end. Like jsonschema's re.search, a pattern
// without `^` may have anything before it, one without `$` anything after it.
//
// Generation stays inside what Python's re and ECMA-262 both accept: \d is [0-9], \w is
// [A-Za-z0-9_], \s is [ \t\n\r\f\v], `.` excludes \n \r U+2028 U+2029, and the negated
// shorthands (and negated classes that contain a shorthand) are limited to ASCII, where the
// two regex dialects agree. Anything else (backreferences, lookaround, \b, flags) is a
// GrammarError naming `pattern`.
#include <string_view>

#include "server/grammar/json_text.hpp"

namespace fp8serve::grammar {

struct RegexLimits {
  int max_pattern_bytes = 4096;
  int max_repeat = 1000;        // the largest {n,m} bound
  int max_char_states = 20000;  // states of the character automaton
};

// Throws GrammarError (keyword "pattern", or `keyword` when given) for what it cannot compile.
CharNfa compile_regex(std::string_view pattern, const RegexLimits& limits = {}, const char* keyword = "pattern");

// The regular expression we use for a JSON Schema `format`, or empty when we do not enforce it.
std::string_view format_regex(std::string_view format);

}  // namespace fp8serve::grammar
