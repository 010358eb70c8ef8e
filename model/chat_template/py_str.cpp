#include "model/chat_template/py_str.hpp"

#include <algorithm>
#include <locale.h>
#include <wctype.h>

#include "model/text/utf8.hpp"

namespace fp8serve::jinja {

namespace {

// Invalid bytes are carried as code points in a private range so they re-encode to themselves.
constexpr char32_t raw_byte_base = 0x110000;

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
         c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

}  // namespace

std::vector<char32_t> to_code_points(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  char32_t cp = 0;
  size_t len = 0;
  for (size_t i = 0; i < text.size();) {
    if (utf8::decode_surrogatepass(text, i, cp, len)) {
      out.push_back(cp);
      i += len;
    } else {
      out.push_back(raw_byte_base + static_cast<unsigned char>(text[i]));
      ++i;
    }
  }
  return out;
}

void append_code_point(std::string& out, char32_t c) {
  if (c >= raw_byte_base) {
    out.push_back(static_cast<char>(c - raw_byte_base));
  } else {
    utf8::append(out, c);
  }
}

std::string from_code_points(const std::vector<char32_t>& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) append_code_point(out, c);
  return out;
}

size_t count_code_points(std::string_view text) {
  size_t n = 0;
  char32_t cp = 0;
  size_t len = 0;
  for (size_t i = 0; i < text.size(); ++n) {
    i += utf8::decode_surrogatepass(text, i, cp, len) ? len : 1;  // an invalid byte counts as one
  }
  return n;
}

bool is_py_space(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return true;
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string py_strip(std::string_view text, const std::string* chars, bool left, bool right) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::vector<char32_t> set;
  if (chars != nullptr) set = to_code_points(*chars);
  auto strip_it = [&](char32_t c) {
    if (chars == nullptr) return is_py_space(c);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return from_code_points(std::vector<char32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b),
                                           cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

namespace {

// Created once and never freed: newlocale does not touch the process-wide locale.
locale_t utf8_locale() {
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return loc;
}

char32_t map_case(char32_t c, bool upper) {
  if (c < 0x80) {
    if (upper && c >= 'a' && c <= 'z') return c - 32;
    if (!upper && c >= 'A' && c <= 'Z') return c + 32;
    return c;
  }
  const locale_t loc = utf8_locale();
  if (loc == static_cast<locale_t>(nullptr) || c >= 0x110000) return c;
  return static_cast<char32_t>(upper ? towupper_l(static_cast<wint_t>(c), loc)
                                     : towlower_l(static_cast<wint_t>(c), loc));
}

void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF) {  // Python's full case mapping: 'ß'.upper() == 'SS'
    out += "SS";
  } else {
    append_code_point(out, map_case(c, true));
  }
}

// The Latin digraph letters (DŽ, LJ, NJ, DZ) have a distinct titlecase form.
char32_t digraph_titlecase(char32_t c) {
  if (c >= 0x1C4 && c <= 0x1CC) return 0x1C5 + 3 * ((c - 0x1C4) / 3);
  if (c >= 0x1F1 && c <= 0x1F3) return 0x1F2;
  return 0;
}

void append_titlecase(std::string& out, char32_t c) {
  if (c == 0xDF) {
    out += "Ss";
  } else if (const char32_t t = digraph_titlecase(c)) {
    append_code_point(out, t);
  } else {
    append_code_point(out, map_case(c, true));
  }
}

bool is_case_ignorable(char32_t c) {
  return c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xA8 || c == 0xAD || c == 0xAF ||
         c == 0xB4 || c == 0xB7 || c == 0xB8 || (c >= 0x300 && c <= 0x36F) || c == 0x2019;
}

bool is_cased(char32_t c) {
  return is_py_upper_char(c) || is_py_lower_char(c) || digraph_titlecase(c) == c;
}

// Python lower-cases a capital sigma that ends a word to the final form 'ς'.
bool is_final_sigma(const std::vector<char32_t>& cps, size_t i) {
  size_t j = i;
  bool cased_before = false;
  while (j > 0) {
    --j;
    if (is_case_ignorable(cps[j])) continue;
    cased_before = is_cased(cps[j]);
    break;
  }
  if (!cased_before) return false;
  for (size_t k = i + 1; k < cps.size(); ++k) {
    if (is_case_ignorable(cps[k])) continue;
    return !is_cased(cps[k]);
  }
  return true;
}

}  // namespace

bool is_py_upper_char(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  const locale_t loc = utf8_locale();
  return loc != static_cast<locale_t>(nullptr) && c < 0x110000 && iswupper_l(static_cast<wint_t>(c), loc) != 0;
}

bool is_py_lower_char(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  if (c == 0xDF) return true;
  const locale_t loc = utf8_locale();
  return loc != static_cast<locale_t>(nullptr) && c < 0x110000 && iswlower_l(static_cast<wint_t>(c), loc) != 0;
}

std::string py_upper(std::string_view text) {
  std::string out;
  for (char32_t c : to_code_points(text)) append_upper(out, c);
  return out;
}

std::string py_lower(std::string_view text) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    append_code_point(out, cps[i] == 0x3A3 && is_final_sigma(cps, i) ? 0x3C2 : map_case(cps[i], false));
  }
  return out;
}

std::string py_title(std::string_view text) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (previous_cased) {
      append_code_point(out, c == 0x3A3 && is_final_sigma(cps, i) ? 0x3C2 : map_case(c, false));
    } else {
      append_titlecase(out, c);
    }
    previous_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(std::string_view text) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      append_titlecase(out, cps[i]);
    } else {
      append_code_point(out, cps[i] == 0x3A3 && is_final_sigma(cps, i) ? 0x3C2 : map_case(cps[i], false));
    }
  }
  return out;
}

std::string jinja_title(std::string_view text) {
  // item[0].upper() + item[1:].lower() per word: lower() sees only the rest of the word.
  const std::vector<char32_t> cps = to_code_points(text);
  std::string out;
  size_t i = 0;
  auto is_separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
  };
  while (i < cps.size()) {
    if (is_separator(cps[i])) {
      append_code_point(out, cps[i++]);
      continue;
    }
    size_t end = i;
    while (end < cps.size() && !is_separator(cps[end])) ++end;
    append_upper(out, cps[i]);
    const std::vector<char32_t> rest(cps.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                     cps.begin() + static_cast<std::ptrdiff_t>(end));
    out += py_lower(from_code_points(rest));
    i = end;
  }
  return out;
}

std::vector<std::string> py_splitlines(std::string_view text) {
  const std::vector<char32_t> cps = to_code_points(text);
  std::vector<std::string> lines;
  std::string current;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (is_line_break(cps[i])) {
      lines.push_back(current);
      current.clear();
      if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    } else {
      append_code_point(current, cps[i]);
    }
  }
  if (!current.empty()) lines.push_back(current);
  return lines;
}

std::string normalize_template_newlines(std::string_view source) {
  const std::vector<std::string> lines = py_splitlines(source);
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out.push_back('\n');
    out += lines[i];
  }
  return out;
}

}  // namespace fp8serve::jinja
