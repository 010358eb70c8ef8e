// Operators with Python's semantics: arithmetic on int/float (bool counts as int), str and list
// concatenation and repetition, chained comparisons, membership, and slicing.
#include <cmath>
#include <limits>

#include "model/chat_template/builtin_args.hpp"
#include "model/chat_template/interpreter.hpp"
#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  if (op == "+" && a.is_string()) fail(std::string("can only concatenate str (not \"") + b.type_name() + "\") to str");
  if (op == "+" && a.is_list()) fail(std::string("can only concatenate list (not \"") + b.type_name() + "\") to list");
  fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

void check_overflow(bool overflow) {
  if (overflow) fail("integer overflow");
}

int64_t int_pow(int64_t base, int64_t exp) {
  int64_t result = 1;
  while (exp > 0) {
    if (exp & 1) check_overflow(__builtin_mul_overflow(result, base, &result));
    exp >>= 1;
    if (exp > 0) check_overflow(__builtin_mul_overflow(base, base, &base));
  }
  return result;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_float() || b.is_float()) {
    const double x = a.as_double();
    const double y = b.as_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**") return Value(std::pow(x, y));
    if (y == 0.0) fail("float division by zero");
    if (op == "/") return Value(x / y);
    const double mod = std::fmod(x, y);
    const double py_mod = (mod != 0.0 && ((mod < 0) != (y < 0))) ? mod + y : mod;
    if (op == "%") return Value(py_mod);
    return Value(std::round((x - py_mod) / y));  // '//': exact quotient of the floored division
  }
  const int64_t x = a.as_int();
  const int64_t y = b.as_int();
  int64_t r = 0;
  if (op == "+" || op == "-" || op == "*") {
    const bool overflow = op == "+" ? __builtin_add_overflow(x, y, &r)
                                    : (op == "-" ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r));
    check_overflow(overflow);
    return Value(r);
  }
  if (op == "**") {
    if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    return Value(int_pow(x, y));
  }
  if (y == 0) fail(op == "/" ? "division by zero" : "integer division or modulo by zero");
  if (op == "/") return Value(static_cast<double>(x) / static_cast<double>(y));
  if (x == std::numeric_limits<int64_t>::min() && y == -1) fail("integer overflow");
  int64_t q = x / y;
  int64_t m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) {
    m += y;
    --q;
  }
  return op == "%" ? Value(m) : Value(q);
}

// Python's PySlice_AdjustIndices for one bound.
int64_t adjust_bound(const Value& v, int64_t length, int64_t step, bool is_start) {
  if (v.is_none() || v.is_undefined()) {
    if (step > 0) return is_start ? 0 : length;
    return is_start ? length - 1 : -1;
  }
  int64_t i = require_int(v, "slice index");
  if (i < 0) {
    i += length;
    if (i < 0) i = step < 0 ? -1 : 0;
  } else if (i >= length) {
    i = step < 0 ? length - 1 : length;
  }
  return i;
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) fail(std::string("'in <string>' requires string as left operand, not ") + item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.find(item.as_string()) != nullptr;
  if (container.is_list()) {
    for (const Value& e : container.as_list()) {
      if (py_equal(e, item)) return true;
    }
    return false;
  }
  if (container.is_undefined()) return false;
  fail(std::string("argument of type '") + container.type_name() + "' is not iterable");
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const int c = py_compare(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

}  // namespace

Value Interpreter::eval_binary(const Expr& expr, Scope& scope) {
  const std::string& op = expr.name;
  if (op == "and" || op == "or") {  // Python returns the deciding operand, not a bool
    Value left = eval(*expr.left, scope);
    if ((op == "and") != left.truthy()) return left;
    return eval(*expr.right, scope);
  }
  const Value a = eval(*expr.left, scope);
  const Value b = eval(*expr.right, scope);
  if (op == "~") {
    std::string s = to_py_str(a) + to_py_str(b);
    ctx_.check_string(s);
    return Value(std::move(s));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {  // Markup.__add__ / __radd__ escape the plain side
        std::string s = escape_to_markup(a).as_string() + escape_to_markup(b).as_string();
        ctx_.check_string(s);
        return Value::markup(std::move(s));
      }
      std::string s = a.as_string() + b.as_string();
      ctx_.check_string(s);
      return Value(std::move(s));
    }
    if (a.is_list() && b.is_list()) {
      ctx_.check_list(a.as_list().size() + b.as_list().size());
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value(std::move(items));
    }
  }
  if (op == "*") {
    const bool a_seq = a.is_string() || a.is_list();
    const bool b_seq = b.is_string() || b.is_list();
    if ((a_seq && (b.is_int() || b.is_bool())) || (b_seq && (a.is_int() || a.is_bool()))) {
      const Value& seq = a_seq ? a : b;
      const int64_t times = std::max<int64_t>(0, a_seq ? b.as_int() : a.as_int());
      if (seq.is_string()) {
        const auto total = static_cast<long double>(seq.as_string().size()) * static_cast<long double>(times);
        if (total > static_cast<long double>(limits_.max_output_bytes)) ctx_.check_string(std::string(limits_.max_output_bytes + 1, ' '));
        std::string s;
        for (int64_t i = 0; i < times; ++i) s += seq.as_string();
        return Value(std::move(s));
      }
      const auto total = static_cast<long double>(seq.as_list().size()) * static_cast<long double>(times);
      if (total > static_cast<long double>(limits_.max_loop_iterations)) ctx_.check_list(limits_.max_loop_iterations + 1);
      List items;
      for (int64_t i = 0; i < times; ++i) items.insert(items.end(), seq.as_list().begin(), seq.as_list().end());
      return Value(std::move(items));
    }
  }
  if (op == "%" && a.is_string()) fail("printf-style string formatting is not supported in chat templates");
  unsupported(op, a, b);
}

bool Interpreter::eval_compare(const Expr& expr, Scope& scope) {
  Value left = eval(*expr.left, scope);
  for (const auto& [op, operand] : expr.chain) {
    Value right = eval(*operand, scope);
    if (!compare(op, left, right)) return false;
    left = std::move(right);
  }
  return true;
}

Value Interpreter::eval_slice(const Expr& expr, Scope& scope) {
  const Value object = eval(*expr.object, scope);
  Value bounds[3];
  for (int i = 0; i < 3; ++i) {
    bounds[i] = expr.slice_parts[i] ? eval(*expr.slice_parts[i], scope) : Value::none();
  }
  const int64_t step = bounds[2].is_none() ? 1 : require_int(bounds[2], "slice step");
  if (step == 0) fail("slice step cannot be zero");
  if (object.is_undefined()) fail_undefined(object);
  std::vector<char32_t> cps;
  int64_t length = 0;
  if (object.is_string()) {
    cps = to_code_points(object.as_string());
    length = static_cast<int64_t>(cps.size());
  } else if (object.is_list()) {
    length = static_cast<int64_t>(object.as_list().size());
  } else {
    fail(std::string("'") + object.type_name() + "' object is not subscriptable");
  }
  const int64_t start = adjust_bound(bounds[0], length, step, true);
  const int64_t stop = adjust_bound(bounds[1], length, step, false);
  std::vector<size_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(static_cast<size_t>(i));
  if (object.is_string()) {
    std::string out;
    for (size_t i : picks) append_code_point(out, cps[i]);
    return object.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  List out;
  out.reserve(picks.size());
  for (size_t i : picks) out.push_back(object.as_list()[i]);
  return Value(std::move(out));
}

}  // namespace fp8serve::jinja
