// Python's str over UTF-8 bytes: templates index, slice, strip and measure strings by code point
// (len('é') == 1), str.strip()/split() treat Unicode whitespace as whitespace, and upper()/lower()
// map case as Python does. The bytes are decoded with the one codec, model/text/utf8.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve::jinja {

// A string's code points. A lone surrogate's bytes decode to it (Python's "surrogatepass"); each
// byte of an invalid sequence is carried as a code point of its own above U+10FFFF, so that
// from_code_points writes it back unchanged as the raw byte.
std::vector<char32_t> to_code_points(std::string_view text);
std::string from_code_points(const std::vector<char32_t>& code_points);
void append_code_point(std::string& out, char32_t code_point);

size_t count_code_points(std::string_view text);

// Python's str.isspace() for one code point.
bool is_py_space(char32_t c);

// Python's str.strip()/lstrip()/rstrip(): with `chars` == nullptr strip whitespace, else strip
// any code point found in *chars.
std::string py_strip(std::string_view text, const std::string* chars, bool left, bool right);

// Python's case mapping: str.upper(), lower(), title(), capitalize(), and the "cased" property
// that title() and islower()/isupper() use. Mapping comes from the C.UTF-8 locale's tables
// (simple case mapping, plus Python's special upper-casing of U+00DF 'ß' to "SS"); where that
// locale is missing only ASCII letters change.
std::string py_upper(std::string_view text);
std::string py_lower(std::string_view text);
std::string py_title(std::string_view text);
std::string py_capitalize(std::string_view text);
// Jinja's title filter: each word (split at '-', whitespace, '(', '{', '[', '<') gets its first
// character upper-cased and the rest lower-cased.
std::string jinja_title(std::string_view text);
bool is_py_upper_char(char32_t c);
bool is_py_lower_char(char32_t c);

// Python's str.splitlines() (no keepends): the line boundaries Python recognises.
std::vector<std::string> py_splitlines(std::string_view text);

// Replaces every Python line boundary by '\n' and drops one trailing line break, which is what
// Jinja's lexer does to a template source (newline_sequence='\n', keep_trailing_newline=False).
std::string normalize_template_newlines(std::string_view source);

}  // namespace fp8serve::jinja
