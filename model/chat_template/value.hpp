// The values a chat template computes with, modelled on the Python objects jinja2 sees when
// transformers renders a template: JSON data (dict, list, str, int, float, bool, None) plus
// Jinja's Undefined, namespace() objects and callables (macros, globals, bound str/dict methods).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fp8serve::jinja {

// Thrown while rendering; ChatTemplate::render turns it into an error value.
enum class ErrorKind { raised, runtime, limit };
class RenderFailure : public std::runtime_error {
 public:
  RenderFailure(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] void fail(const std::string& message);
class Value;
// Using an Undefined (attribute access, arithmetic, calling it) is an error naming what was missing.
[[noreturn]] void fail_undefined(const Value& undefined);

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python's dict

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* keyword_arg(const std::string& name) const;
};
using NativeFunction = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;
  NativeFunction fn;
};

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, callable };

  Value() = default;  // undefined
  static Value none();
  static Value undefined(std::string hint = {});
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List items);
  Value(Dict items);
  static Value make_namespace(Dict attrs);
  // A Python tuple: a list that prints as (a, b) and never equals a list.
  static Value tuple(List items);
  static Value function(std::string name, NativeFunction fn);
  // markupsafe's Markup: a str that `|safe` and `|escape` make. Concatenating a plain str to it
  // escapes that str, and its string methods return Markup; `~` and printing see plain text.
  static Value markup(std::string s);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  bool is_float() const { return kind_ == Kind::floating; }
  bool is_number() const { return is_bool() || is_int() || is_float(); }  // Python: bool is an int
  bool is_string() const { return kind_ == Kind::string; }
  bool is_markup() const { return kind_ == Kind::string && markup_; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_tuple() const { return kind_ == Kind::list && tuple_; }
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_namespace() const { return kind_ == Kind::ns; }
  bool is_callable() const { return kind_ == Kind::callable; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const;  // bool or integer
  double as_double() const;  // any number
  const std::string& as_string() const { return *string_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& namespace_attrs() const { return *dict_; }  // namespaces are shared and mutable
  const Callable& as_callable() const { return *callable_; }
  const std::string& undefined_hint() const { return hint_; }

  // Python truthiness (Undefined is false).
  bool truthy() const;
  // Dict lookup by key; nullptr when absent.
  const Value* find(const std::string& key) const;
  // Python len(); throws for types without a length.
  size_t length() const;

  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);
  const char* type_name() const;

 private:
  Kind kind_ = Kind::undefined;
  bool bool_ = false;
  bool tuple_ = false;
  bool markup_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string hint_;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> callable_;
};

// markupsafe.escape(): & < > " ' as HTML entities; a Markup value is returned unchanged.
std::string html_escape(const std::string& text);
Value escape_to_markup(const Value& v);

// Python str(value) as Jinja prints it: None -> "None", True -> "True", 1.0 -> "1.0",
// lists and dicts in repr form; Undefined prints as "".
std::string to_py_str(const Value& v);
std::string to_py_repr(const Value& v, int depth = 0);
std::string py_float_repr(double d);

// Python ==, and <, > for numbers, strings and lists (TypeError otherwise).
bool py_equal(const Value& a, const Value& b, int depth = 0);
int py_compare(const Value& a, const Value& b, int depth = 0);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None (single line)
  std::string indent_string;  // used when indent was given as a string
  bool indent_is_string = false;
  std::string item_separator;  // empty: Python's default for the indent mode
  std::string key_separator;
  bool has_separators = false;
  bool sort_keys = false;
};
std::string py_json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace fp8serve::jinja
