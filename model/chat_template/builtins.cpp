#include "model/chat_template/builtins.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "model/chat_template/builtin_args.hpp"
#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

void BuiltinContext::check_string(const std::string& s) const {
  if (s.size() > limits.max_output_bytes) {
    throw RenderFailure(ErrorKind::limit, "string grew past the output limit of " +
                                              std::to_string(limits.max_output_bytes) + " bytes");
  }
}

void BuiltinContext::check_list(size_t size) const {
  if (size > limits.max_loop_iterations) {
    throw RenderFailure(ErrorKind::limit, "list grew past the limit of " +
                                              std::to_string(limits.max_loop_iterations) + " items");
  }
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return {};
    case Value::Kind::list:
      return v.as_list();
    case Value::Kind::dict: {
      List keys;
      for (const auto& [k, e] : v.as_dict()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      for (char32_t c : to_code_points(v.as_string())) {
        std::string s;
        append_code_point(s, c);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

Value get_attribute_path(const Value& object, const std::string& dotted) {
  Value current = object;
  size_t start = 0;
  while (true) {
    const size_t dot = dotted.find('.', start);
    const std::string part = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::stoll(part.substr(0, 18)))))
                      : get_item(current, Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

namespace {

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Value tojson_filter(const Value& input, CallArgs& args) {
  JsonDumpOptions o;
  o.ensure_ascii = arg_or(args, 0, "ensure_ascii", Value(false)).truthy();
  const Value indent = arg_or(args, 1, "indent", Value::none());
  if (indent.is_string()) {
    o.indent_is_string = true;
    o.indent_string = indent.as_string();
  } else if (!indent.is_none()) {
    o.indent = static_cast<int>(std::clamp<int64_t>(require_int(indent, "indent"), 0, 64));
  }
  const Value separators = arg_or(args, 2, "separators", Value::none());
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.as_list().size() != 2) fail("separators must be a pair of strings");
    o.has_separators = true;
    o.item_separator = require_string(separators.as_list()[0], "separator");
    o.key_separator = require_string(separators.as_list()[1], "separator");
  }
  o.sort_keys = arg_or(args, 3, "sort_keys", Value(false)).truthy();
  return Value(py_json_dumps(input, o));
}

Value indent_filter(const BuiltinContext& ctx, const Value& input, CallArgs& args) {
  const Value width = arg_or(args, 0, "width", Value(int64_t{4}));
  const bool first = arg_or(args, 1, "first", Value(false)).truthy();
  const bool blank = arg_or(args, 2, "blank", Value(false)).truthy();
  const std::string indention = width.is_string()
                                    ? width.as_string()
                                    : std::string(static_cast<size_t>(std::clamp<int64_t>(require_int(width, "width"), 0, 1024)), ' ');
  const std::string s = to_py_str(input) + "\n";  // jinja2 appends a newline before splitlines()
  const std::vector<std::string> lines = py_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  ctx.check_string(rv);
  return Value(std::move(rv));
}

std::string replace_all(const BuiltinContext& ctx, const std::string& s, const std::string& old_s,
                        const std::string& new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {  // Python inserts `new` between characters
    int64_t done = 0;
    for (char32_t c : to_code_points(s)) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      append_code_point(out, c);
      ctx.check_string(out);
    }
    if (count < 0 || done < count) out += new_s;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old_s, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += new_s;
    ctx.check_string(out);
    pos = hit + old_s.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  ctx.check_string(out);
  return out;
}

// select / reject / selectattr / rejectattr share this: args after `skip` name a test. As in
// jinja2, a falsy input (none, false, 0, '', [], {}, undefined) yields nothing before the
// arguments are even looked at.
List filter_by_test(const BuiltinContext& ctx, const Value& input, CallArgs& args, size_t skip,
                    bool with_attribute, bool keep_if) {
  if (!input.truthy()) return {};
  std::string attribute;
  if (with_attribute) {
    if (args.positional.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = require_string(args.positional[0], "attribute");
  }
  std::string test_name;
  CallArgs test_args;
  if (args.positional.size() > skip) {
    test_name = require_string(args.positional[skip], "test name");
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(skip) + 1, args.positional.end());
    test_args.keyword = args.keyword;
  }
  List out;
  for (const Value& item : iterate(input)) {
    const Value subject = with_attribute ? get_attribute_path(item, attribute) : item;
    CallArgs a = test_args;
    const bool pass = test_name.empty() ? subject.truthy() : apply_test(ctx, test_name, subject, a);
    if (pass == keep_if) out.push_back(item);
  }
  return out;
}

Value map_filter(const BuiltinContext& ctx, const Value& input, CallArgs& args) {
  List out;
  if (!input.truthy()) return Value(std::move(out));  // jinja2: `if value:` before anything else
  if (const Value* attribute = args.keyword_arg("attribute")) {
    const std::string& path = require_string(*attribute, "attribute");
    const Value* fallback = args.keyword_arg("default");
    for (const Value& item : iterate(input)) {
      Value v = get_attribute_path(item, path);
      if (v.is_undefined() && fallback != nullptr) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value(std::move(out));
  }
  if (args.positional.empty()) fail("map needs a filter name or attribute=");
  const std::string filter = require_string(args.positional[0], "filter name");
  for (const Value& item : iterate(input)) {
    CallArgs a;
    a.positional.assign(args.positional.begin() + 1, args.positional.end());
    a.keyword = args.keyword;
    out.push_back(apply_filter(ctx, filter, item, a));
  }
  return Value(std::move(out));
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(ascii_lower(v.as_string()));
  return v;
}

Value sort_filter(const Value& input, CallArgs& args) {
  const bool reverse = arg_or(args, 0, "reverse", Value(false)).truthy();
  const bool case_sensitive = arg_or(args, 1, "case_sensitive", Value(false)).truthy();
  const Value attribute = arg_or(args, 2, "attribute", Value::none());
  List items = iterate(input);
  auto key = [&](const Value& v) {
    return sort_key(attribute.is_none() ? v : get_attribute_path(v, to_py_str(attribute)), case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? py_compare(key(b), key(a)) < 0 : py_compare(key(a), key(b)) < 0;
  });
  return Value(std::move(items));
}

Value items_filter(const Value& input) {
  if (input.is_undefined()) return Value(List{});
  if (!input.is_dict()) fail("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, v] : input.as_dict()) out.push_back(Value::tuple(List{Value(k), v}));
  return Value(std::move(out));
}

Value number_filter(const Value& input, CallArgs& args, bool to_int) {
  const Value fallback = arg_or(args, 0, "default", to_int ? Value(int64_t{0}) : Value(0.0));
  if (input.is_number()) {
    if (!to_int) return Value(input.as_double());
    if (input.is_float()) {
      const double d = input.as_double();
      if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
      return Value(static_cast<int64_t>(d));
    }
    return Value(input.as_int());
  }
  if (input.is_string()) {
    const std::string s = py_strip(input.as_string(), nullptr, true, true);
    if (s.empty()) return fallback;
    char* end = nullptr;
    if (to_int) {
      errno = 0;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (errno == 0 && end == s.c_str() + s.size()) return Value(static_cast<int64_t>(v));
    }
    const double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) return fallback;
    if (!to_int) return Value(d);
    if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return fallback;
    return Value(static_cast<int64_t>(d));
  }
  return fallback;
}

Value first_or_last(const Value& input, bool first) {
  // jinja2's last() calls reversed(), whose error names reversibility.
  if (!first && !input.is_undefined() && !input.is_string() && !input.is_list() && !input.is_dict())
    fail(std::string("'") + input.type_name() + "' object is not reversible");
  const List items = iterate(input);
  if (items.empty()) return Value::undefined("no first/last item");
  return first ? items.front() : items.back();
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first",
      "float", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
      "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
      "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper"};
  return names;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
      "false", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan",
      "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string",
      "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};
  return names;
}

}  // namespace

bool is_known_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool is_known_test(const std::string& name) { return test_names().count(name) > 0; }

Value apply_filter(const BuiltinContext& ctx, const std::string& name, const Value& input, CallArgs& args) {
  if (name == "trim") {
    const Value chars = arg_or(args, 0, "chars", Value::none());
    const std::string chars_s = chars.is_none() ? "" : to_py_str(chars);
    std::string out = py_strip(to_py_str(input), chars.is_none() ? nullptr : &chars_s, true, true);
    return input.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
  }
  if (name == "length" || name == "count") return Value(static_cast<int64_t>(input.length()));
  // jinja2 applies these to soft_str(value), which keeps a Markup a Markup (title joins plain
  // strings, so its result is plain).
  const auto same_kind = [&](std::string s) { return input.is_markup() ? Value::markup(std::move(s)) : Value(std::move(s)); };
  if (name == "upper") return same_kind(py_upper(to_py_str(input)));
  if (name == "lower") return same_kind(py_lower(to_py_str(input)));
  if (name == "capitalize") return same_kind(py_capitalize(to_py_str(input)));
  if (name == "title") return Value(jinja_title(to_py_str(input)));
  if (name == "string") return same_kind(to_py_str(input));
  if (name == "safe") return input.is_markup() ? input : Value::markup(to_py_str(input));
  if (name == "e" || name == "escape") return escape_to_markup(input);
  if (name == "tojson") {
    Value out = tojson_filter(input, args);
    ctx.check_string(out.as_string());
    return out;
  }
  if (name == "default" || name == "d") {
    const Value fallback = arg_or(args, 0, "default_value", Value(std::string()));
    const bool boolean = arg_or(args, 1, "boolean", Value(false)).truthy();
    if (input.is_undefined() || (boolean && !input.truthy())) return fallback;
    return input;
  }
  if (name == "first" || name == "last") return first_or_last(input, name == "first");
  if (name == "items") return items_filter(input);
  if (name == "list") return Value(iterate(input));
  if (name == "join") {
    const std::string sep = to_py_str(arg_or(args, 0, "d", Value(std::string())));
    const Value attribute = arg_or(args, 1, "attribute", Value::none());
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input)) {
      if (!first) out += sep;
      first = false;
      out += to_py_str(attribute.is_none() ? item : get_attribute_path(item, to_py_str(attribute)));
      ctx.check_string(out);
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    const Value count = arg_or(args, 2, "count", Value::none());
    return Value(replace_all(ctx, to_py_str(input), to_py_str(arg_or(args, 0, "old", Value(""))),
                             to_py_str(arg_or(args, 1, "new", Value(""))),
                             count.is_none() ? -1 : require_int(count, "count")));
  }
  if (name == "indent") {
    // jinja2 does `s += "\n"` and then s.splitlines(): only strings get that far.
    if (input.is_undefined()) fail_undefined(input);
    if (input.is_list()) fail("'list' object has no attribute 'splitlines'");
    if (!input.is_string())
      fail(std::string("unsupported operand type(s) for +=: '") + input.type_name() + "' and 'str'");
    Value out = indent_filter(ctx, input, args);
    return input.is_markup() ? Value::markup(out.as_string()) : out;
  }
  if (name == "select" || name == "reject") {
    return Value(filter_by_test(ctx, input, args, 0, false, name == "select"));
  }
  if (name == "selectattr" || name == "rejectattr") {
    return Value(filter_by_test(ctx, input, args, 1, true, name == "selectattr"));
  }
  if (name == "map") return map_filter(ctx, input, args);
  if (name == "sort") return sort_filter(input, args);
  if (name == "dictsort") {
    if (input.is_undefined()) fail_undefined(input);
    if (!input.is_dict()) fail(std::string("'") + input.type_name() + "' object has no attribute 'items'");
    Value pairs = items_filter(input);
    List items = pairs.as_list();
    const bool by_value = to_py_str(arg_or(args, 1, "by", Value("key"))) == "value";
    const bool case_sensitive = arg_or(args, 0, "case_sensitive", Value(false)).truthy();
    const bool reverse = arg_or(args, 2, "reverse", Value(false)).truthy();
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value& ka = a.as_list()[by_value ? 1 : 0];
      const Value& kb = b.as_list()[by_value ? 1 : 0];
      const int c = py_compare(sort_key(ka, case_sensitive), sort_key(kb, case_sensitive));
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (name == "unique") {
    const bool case_sensitive = arg_or(args, 0, "case_sensitive", Value(false)).truthy();
    List out;
    List seen;
    for (const Value& item : iterate(input)) {
      const Value key = sort_key(item, case_sensitive);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value(std::move(out));
  }
  if (name == "reverse") {
    if (!input.is_undefined() && !input.is_string() && !input.is_list() && !input.is_dict())
      fail("argument must be iterable");
    if (input.is_string()) {  // value[::-1]: a Markup slice is a Markup
      std::vector<char32_t> cps = to_code_points(input.as_string());
      std::reverse(cps.begin(), cps.end());
      return input.is_markup() ? Value::markup(from_code_points(cps)) : Value(from_code_points(cps));
    }
    List items = iterate(input);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "int" || name == "float") {
    if (input.is_undefined()) fail_undefined(input);  // int(Undefined) raises in jinja2
    return number_filter(input, args, name == "int");
  }
  if (name == "abs") {
    if (input.is_float()) return Value(std::fabs(input.as_double()));
    if (input.is_number()) {
      if (input.as_int() == INT64_MIN) fail("integer overflow");
      return Value(input.as_int() < 0 ? -input.as_int() : input.as_int());
    }
    fail(std::string("bad operand type for abs(): '") + input.type_name() + "'");
  }
  if (name == "round") {
    if (!input.is_number()) fail(std::string("type ") + input.type_name() + " doesn't define __round__ method");
    const int64_t precision = require_int(arg_or(args, 0, "precision", Value(int64_t{0})), "precision");
    const std::string method = to_py_str(arg_or(args, 1, "method", Value("common")));
    const double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -30, 30)));
    const double x = input.as_double() * scale;
    double r = 0;
    if (method == "common") {
      r = std::nearbyint(x);  // Python's round() rounds half to even
      if (!input.is_float()) {  // Python: round(int, n) stays an int (n < 0 rounds it to 10^-n)
        if (precision >= 0) return Value(input.as_int());
        return Value(static_cast<int64_t>(r / scale));
      }
    } else if (method == "ceil") {
      r = std::ceil(x);
    } else if (method == "floor") {
      r = std::floor(x);
    } else {
      fail("method must be common, ceil or floor");
    }
    return Value(r / scale);
  }
  if (name == "max" || name == "min" || name == "sum") {
    const List items = iterate(input);
    if (name == "sum") {
      Value total = arg_or(args, 1, "start", Value(int64_t{0}));
      for (const Value& item : items) {
        if (!item.is_number() || !total.is_number()) fail("sum needs numbers");
        total = (item.is_float() || total.is_float()) ? Value(total.as_double() + item.as_double())
                                                       : Value(total.as_int() + item.as_int());
      }
      return total;
    }
    if (items.empty()) return Value::undefined("empty sequence");
    Value best = items[0];
    for (const Value& item : items) {
      const int c = py_compare(sort_key(item, false), sort_key(best, false));
      if (name == "max" ? c > 0 : c < 0) best = item;
    }
    return best;
  }
  if (name == "attr") {
    if (input.is_undefined()) fail_undefined(input);
    return get_method(ctx, input, require_string(arg_or(args, 0, "name", Value("")), "attribute name"));
  }
  fail("no filter named '" + name + "'");
}

bool apply_test(const BuiltinContext& ctx, const std::string& name, const Value& input, CallArgs& args) {
  (void)ctx;
  auto other = [&]() {
    if (args.positional.empty()) fail("test '" + name + "' needs an argument");
    return args.positional[0];
  };
  if (name == "defined") return !input.is_undefined();
  if (name == "undefined") return input.is_undefined();
  if (name == "none") return input.is_none();
  if (name == "boolean") return input.is_bool();
  if (name == "true") return input.is_bool() && input.as_bool();
  if (name == "false") return input.is_bool() && !input.as_bool();
  if (name == "integer") return input.is_int();
  if (name == "float") return input.is_float();
  if (name == "number") return input.is_number();
  if (name == "string") return input.is_string();
  if (name == "mapping") return input.is_dict();
  if (name == "iterable") return input.is_undefined() || input.is_string() || input.is_list() || input.is_dict();
  if (name == "sequence") return input.is_undefined() || input.is_string() || input.is_list() || input.is_dict();
  if (name == "callable") return input.is_callable();
  if (name == "escaped") return input.is_markup();
  if (name == "sameas") {
    const Value o = other();
    if (input.is_none() || o.is_none()) return input.is_none() && o.is_none();
    if (input.is_bool() || o.is_bool()) return input.is_bool() && o.is_bool() && input.as_bool() == o.as_bool();
    return input.kind() == o.kind() && py_equal(input, o);
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(input, other());
  if (name == "ne" || name == "!=") return !py_equal(input, other());
  if (name == "lt" || name == "lessthan" || name == "<") return py_compare(input, other()) < 0;
  if (name == "le" || name == "<=") return py_compare(input, other()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return py_compare(input, other()) > 0;
  if (name == "ge" || name == ">=") return py_compare(input, other()) >= 0;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const int64_t n = require_int(input, "value");
    const int64_t d = name == "divisibleby" ? require_int(other(), "divisor") : 2;
    if (d == 0) fail("integer division or modulo by zero");
    const int64_t r = ((n % d) + d) % d;
    return name == "odd" ? r == 1 : r == 0;
  }
  if (name == "lower" || name == "upper") {
    bool cased = false;
    for (char32_t c : to_code_points(to_py_str(input))) {
      const bool up = is_py_upper_char(c);
      const bool low = is_py_lower_char(c);
      if (name == "lower" ? up : low) return false;
      cased = cased || up || low;
    }
    return cased;
  }
  if (name == "in") {
    const Value container = other();
    if (container.is_string()) return input.is_string() && container.as_string().find(input.as_string()) != std::string::npos;
    if (container.is_dict()) return input.is_string() && container.find(input.as_string()) != nullptr;
    for (const Value& item : iterate(container)) {
      if (py_equal(item, input)) return true;
    }
    return false;
  }
  fail("no test named '" + name + "'");
}

}  // namespace fp8serve::jinja
