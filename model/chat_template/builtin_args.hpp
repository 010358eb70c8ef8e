// Argument helpers shared by the filter, test and method tables: Python-style positional or
// keyword lookup with defaults, and type checks that fail with Python's wording.
#pragma once

#include <string>

#include "model/chat_template/value.hpp"

namespace fp8serve::jinja {

// args[index] if given positionally, else the keyword `name`, else fallback.
inline Value arg_or(const CallArgs& args, size_t index, const char* name, Value fallback) {
  if (index < args.positional.size()) return args.positional[index];
  if (const Value* v = args.keyword_arg(name)) return *v;
  return fallback;
}

inline const std::string& require_string(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " must be a string, not " + v.type_name());
  return v.as_string();
}

inline int64_t require_int(const Value& v, const char* what) {
  if (!v.is_int() && !v.is_bool()) fail(std::string(what) + " must be an integer, not " + v.type_name());
  return v.as_int();
}

// Python iteration: list items, dict keys, string characters; Undefined iterates as empty.
List iterate(const Value& v);

// environment.getattr / getitem semantics for attribute paths like "function.name".
Value get_attribute_path(const Value& object, const std::string& dotted);
Value get_item(const Value& object, const Value& key);
struct BuiltinContext;
Value get_attr(const BuiltinContext& ctx, const Value& object, const std::string& name);

}  // namespace fp8serve::jinja
