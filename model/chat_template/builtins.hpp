// Jinja's filters, tests, the str/dict methods templates call, and the globals transformers adds
// (raise_exception, strftime_now, namespace, dict) plus range. Names are checked at load time.
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include "model/chat_template/value.hpp"

namespace fp8serve::jinja {

struct RenderLimits {
  size_t max_output_bytes = 4u << 20;      // rendered prompt, and any one string built on the way
  uint64_t max_loop_iterations = 1u << 20;  // all loop iterations together, and list sizes
  int max_call_depth = 32;                  // macro recursion
};

// What filters and methods need from the render: size limits, and the list of namespaces the
// render created (a namespace can hold itself; the render clears them all at the end to break
// such reference cycles).
struct BuiltinContext {
  const RenderLimits& limits;
  std::vector<Value>* namespaces = nullptr;
  void check_string(const std::string& s) const;
  void check_list(size_t size) const;
};

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

Value apply_filter(const BuiltinContext& ctx, const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const BuiltinContext& ctx, const std::string& name, const Value& input, CallArgs& args);

// obj.name for str, dict and list values (bound methods); Undefined when there is none.
Value get_method(const BuiltinContext& ctx, const Value& object, const std::string& name);

// Globals every render sees: range, namespace, dict, raise_exception, strftime_now(now).
Dict make_globals(const BuiltinContext& ctx, const std::tm& now);

}  // namespace fp8serve::jinja
