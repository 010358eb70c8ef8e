#include "model/chat_template/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

void fail(const std::string& message) { throw RenderFailure(ErrorKind::runtime, message); }

void fail_undefined(const Value& undefined) {
  fail(undefined.undefined_hint().empty() ? "undefined value used" : undefined.undefined_hint());
}

const Value* CallArgs::keyword_arg(const std::string& name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::none;
  return v;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

Value::Value(bool b) : kind_(Kind::boolean), bool_(b) {}
Value::Value(int64_t i) : kind_(Kind::integer), int_(i) {}
Value::Value(double d) : kind_(Kind::floating), float_(d) {}
Value::Value(std::string s)
    : kind_(Kind::string), string_(std::make_shared<const std::string>(std::move(s))) {}
Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

Value::Value(List items)
    : kind_(Kind::list), list_(std::make_shared<const List>(std::move(items))) {}
Value::Value(Dict items) : kind_(Kind::dict), dict_(std::make_shared<Dict>(std::move(items))) {}

Value Value::make_namespace(Dict attrs) {
  Value v(std::move(attrs));
  v.kind_ = Kind::ns;
  return v;
}

Value Value::tuple(List items) {
  Value v(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::function(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::callable;
  v.callable_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

int64_t Value::as_int() const { return kind_ == Kind::boolean ? (bool_ ? 1 : 0) : int_; }

double Value::as_double() const {
  return kind_ == Kind::floating ? float_ : static_cast<double>(as_int());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return bool_;
    case Kind::integer:
      return int_ != 0;
    case Kind::floating:
      return float_ != 0.0;
    case Kind::string:
      return !string_->empty();
    case Kind::list:
      return !list_->empty();
    case Kind::dict:
      return !dict_->empty();
    default:
      return true;
  }
}

const Value* Value::find(const std::string& key) const {
  if (kind_ != Kind::dict && kind_ != Kind::ns) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

size_t Value::length() const {
  switch (kind_) {
    case Kind::undefined:
      return 0;
    case Kind::string:
      return count_code_points(*string_);
    case Kind::list:
      return list_->size();
    case Kind::dict:
      return dict_->size();
    default:
      fail(std::string("object of type '") + type_name() + "' has no len()");
  }
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return markup_ ? "Markup" : "str";
    case Kind::list: return "list";
    case Kind::dict: return "dict";
    case Kind::ns: return "Namespace";
    case Kind::callable: return "function";
  }
  return "?";
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  // The request body is already bounded by the HTTP layer; the depth bound keeps the recursive
  // printers and comparisons below off the end of the stack.
  if (depth > 256) fail("input nested too deeply (more than 256 levels)");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value(static_cast<int64_t>(u));
      }
      return Value(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, from_json(e, depth + 1));
      return Value(std::move(items));
    }
    default:
      fail("unsupported JSON value (binary)");
  }
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_buf;
  }
  if (exponent < 0) {
    return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  }
  const auto int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len) {
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

bool py_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || c >= 0x110000) return false;  // surrogates, private use
  return true;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : to_code_points(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!py_printable(c)) {
      char buf[16];
      const unsigned cu = c >= 0x110000 ? static_cast<unsigned>(c - 0x110000) : c;
      if (cu <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", cu);
      } else if (cu <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cu);
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", cu);
      }
      out += buf;
    } else {
      append_code_point(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

namespace {
constexpr int max_value_depth = 512;
}  // namespace

std::string to_py_repr(const Value& v, int depth) {
  if (depth > max_value_depth) fail("value nested too deeply to print");
  switch (v.kind()) {
    case Value::Kind::string:
      return v.is_markup() ? "Markup(" + string_repr(v.as_string()) + ")" : string_repr(v.as_string());
    case Value::Kind::list: {
      std::string out = v.is_tuple() ? "(" : "[";
      bool first = true;
      for (const Value& e : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        out += to_py_repr(e, depth + 1);
      }
      if (v.is_tuple() && v.as_list().size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case Value::Kind::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, e] : v.as_dict()) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(k) + ": " + to_py_repr(e, depth + 1);
      }
      return out + "}";
    }
    default:
      return to_py_str(v);
  }
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value escape_to_markup(const Value& v) { return v.is_markup() ? v : Value::markup(html_escape(to_py_str(v))); }

std::string to_py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.as_bool() ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.as_int());
    case Value::Kind::floating: return py_float_repr(v.as_double());
    case Value::Kind::string: return v.as_string();
    case Value::Kind::list:
    case Value::Kind::dict: return to_py_repr(v);
    case Value::Kind::ns: return "<Namespace>";
    case Value::Kind::callable: return "<function " + v.as_callable().name + ">";
  }
  return "";
}

bool py_equal(const Value& a, const Value& b, int depth) {
  if (depth > max_value_depth) fail("value nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind() || a.is_tuple() != b.is_tuple()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return true;
    case Value::Kind::string:
      return a.as_string() == b.as_string();
    case Value::Kind::list: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::dict: {
      const Dict& x = a.as_dict();
      if (x.size() != b.as_dict().size()) return false;
      for (const auto& [k, e] : x) {
        const Value* other = b.find(k);
        if (other == nullptr || !py_equal(e, *other, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::ns:
      return &a.namespace_attrs() == &b.namespace_attrs();
    default:
      return false;
  }
}

int py_compare(const Value& a, const Value& b, int depth) {
  if (depth > max_value_depth) fail("value nested too deeply to compare");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double();
      const double y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is what Python compares.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List& x = a.as_list();
    const List& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!py_equal(x[i], y[i], depth + 1)) return py_compare(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  fail(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" + b.type_name() +
       "'");
}

namespace {

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : to_code_points(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c > 0x7E && c < 0x110000) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          append_code_point(out, c);
        }
      }
    }
  }
  out.push_back('"');
}

void json_dump(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  if (level > max_value_depth) fail("value nested too deeply for tojson");
  const bool pretty = o.indent >= 0 || o.indent_is_string;
  const std::string item_sep = o.has_separators ? o.item_separator : (pretty ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int i = 0; i < lvl; ++i) {
      out += o.indent_is_string ? o.indent_string : std::string(static_cast<size_t>(o.indent), ' ');
    }
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py_float_repr(d);
      }
      return;
    }
    case Value::Kind::string: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::list: {
      const List& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        if (pretty) newline(level + 1);
        json_dump(out, items[i], o, level + 1);
      }
      if (pretty) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::dict: {
      Dict items = v.as_dict();
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        if (pretty) newline(level + 1);
        json_string(out, items[i].first, o.ensure_ascii);
        out += key_sep;
        json_dump(out, items[i].second, o, level + 1);
      }
      if (pretty) newline(level);
      out.push_back('}');
      return;
    }
    default:
      fail(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string py_json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  json_dump(out, v, options, 0);
  return out;
}

}  // namespace fp8serve::jinja
