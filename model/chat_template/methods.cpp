// Attribute and item access (jinja2's sandboxed getattr/getitem), the str and dict methods
// templates call, and the render globals.
#include <algorithm>
#include <cstdio>

#include "model/chat_template/builtin_args.hpp"
#include "model/chat_template/builtins.hpp"
#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

namespace {

std::vector<std::string> py_split(const BuiltinContext& ctx, const std::string& s, const Value& sep_v,
                                  int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep_v.is_none()) {  // split on runs of whitespace, ignoring leading/trailing whitespace
    const std::vector<char32_t> cps = to_code_points(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        std::vector<char32_t> rest(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.end());
        parts.push_back(py_strip(from_code_points(rest), nullptr, false, true));
        break;
      }
      std::string word;
      while (i < cps.size() && !is_py_space(cps[i])) append_code_point(word, cps[i++]);
      parts.push_back(std::move(word));
    }
    ctx.check_list(parts.size());
    return parts;
  }
  const std::string& sep = require_string(sep_v, "separator");
  if (sep.empty()) fail("empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    parts.push_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  parts.push_back(s.substr(pos));
  ctx.check_list(parts.size());
  return parts;
}

Value to_list(const std::vector<std::string>& parts) {
  List out;
  out.reserve(parts.size());
  for (const std::string& p : parts) out.emplace_back(p);
  return Value(std::move(out));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = require_string(a, prefix ? "startswith argument" : "endswith argument");
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

Value string_method(const BuiltinContext& ctx, const std::string& s, const std::string& name) {
  const std::string self = s;
  auto method = [&](NativeFunction fn) { return Value::function("str." + name, std::move(fn)); };
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return method([self, prefix](CallArgs& a) {
      if (a.positional.empty()) fail("startswith/endswith need an argument");
      if (a.positional.size() > 1) fail("start/end arguments of startswith/endswith are not supported");
      return Value(affix_match(self, a.positional[0], prefix));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return method([self, left, right](CallArgs& a) {
      const Value chars = arg_or(a, 0, "chars", Value::none());
      if (chars.is_none()) return Value(py_strip(self, nullptr, left, right));
      const std::string& c = require_string(chars, "strip argument");
      return Value(py_strip(self, &c, left, right));
    });
  }
  if (name == "split") {
    return method([self, ctx](CallArgs& a) {
      const Value maxsplit = arg_or(a, 1, "maxsplit", Value(int64_t{-1}));
      return to_list(py_split(ctx, self, arg_or(a, 0, "sep", Value::none()), require_int(maxsplit, "maxsplit")));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return method([self, name](CallArgs&) {
      if (name == "upper") return Value(py_upper(self));
      if (name == "lower") return Value(py_lower(self));
      if (name == "title") return Value(py_title(self));
      return Value(py_capitalize(self));
    });
  }
  if (name == "replace") {
    return method([self, ctx](CallArgs& a) {
      CallArgs filter_args;
      filter_args.positional = {arg_or(a, 0, "old", Value("")), arg_or(a, 1, "new", Value(""))};
      const Value count = arg_or(a, 2, "count", Value(int64_t{-1}));
      if (count.as_int() >= 0) filter_args.positional.push_back(count);
      return apply_filter(ctx, "replace", Value(self), filter_args);
    });
  }
  if (name == "find" || name == "count") {
    return method([self, name](CallArgs& a) {
      const std::string& sub = require_string(arg_or(a, 0, "sub", Value::none()), name.c_str());
      if (name == "find") {
        const size_t hit = self.find(sub);
        if (hit == std::string::npos) return Value(int64_t{-1});
        return Value(static_cast<int64_t>(count_code_points(std::string_view(self).substr(0, hit))));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(count_code_points(self) + 1));
      int64_t n = 0;
      for (size_t p = self.find(sub); p != std::string::npos; p = self.find(sub, p + sub.size())) ++n;
      return Value(n);
    });
  }
  if (name == "join") {
    return method([self, ctx](CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(arg_or(a, 0, "iterable", Value(List{})))) {
        if (!first) out += self;
        first = false;
        out += require_string(item, "join item");
        ctx.check_string(out);
      }
      return Value(std::move(out));
    });
  }
  if (name == "splitlines") {
    return method([self](CallArgs&) { return to_list(py_splitlines(self)); });
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    return method([self, name](CallArgs&) {
      if (self.empty()) return Value(false);
      for (char32_t c : to_code_points(self)) {
        bool ok = false;
        if (name == "isspace") {
          ok = is_py_space(c);
        } else if (c < 0x80) {
          const auto ch = static_cast<unsigned char>(c);
          ok = name == "isdigit" ? std::isdigit(ch) != 0 : (name == "isalpha" ? std::isalpha(ch) != 0 : std::isalnum(ch) != 0);
        }
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value::undefined("str has no attribute '" + name + "'");
}

Value dict_method(const Value& dict, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::function("dict." + name, [dict, name](CallArgs&) {
      List out;
      for (const auto& [k, v] : dict.as_dict()) {
        if (name == "items") {
          out.push_back(Value::tuple(List{Value(k), v}));
        } else {
          out.push_back(name == "keys" ? Value(k) : v);
        }
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return Value::function("dict.get", [dict](CallArgs& a) {
      const Value key = arg_or(a, 0, "key", Value::none());
      const Value fallback = arg_or(a, 1, "default", Value::none());
      if (!key.is_string()) return fallback;
      const Value* v = dict.find(key.as_string());
      return v != nullptr ? *v : fallback;
    });
  }
  return Value::undefined("dict has no attribute '" + name + "'");
}

bool is_dict_method(const std::string& name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

// Python's slice index normalisation for a sequence of length n.
int64_t clamp_index(int64_t i, int64_t n) {
  if (i < 0) i += n;
  return i;
}

}  // namespace

// markupsafe's Markup methods: case and strip methods and replace escape their string arguments
// and return Markup; split and splitlines return Markup parts; join escapes the items. The rest
// (find, startswith, isdigit, ...) are str's.
Value markup_method(const BuiltinContext& ctx, const Value& object, const std::string& name) {
  Value plain = string_method(ctx, object.as_string(), name);
  static const char* const kEscaping[] = {"upper", "lower", "title", "capitalize", "strip", "lstrip", "rstrip", "replace"};
  const bool escaping = std::find(std::begin(kEscaping), std::end(kEscaping), name) != std::end(kEscaping);
  if (!plain.is_callable() || !(escaping || name == "split" || name == "splitlines" || name == "join")) return plain;
  const Callable fn = plain.as_callable();
  return Value::function("Markup." + name, [fn, escaping, name](CallArgs& a) {
    auto escape_strings = [](Value& v) {
      if (v.is_string()) v = escape_to_markup(v);
    };
    if (escaping) {
      for (Value& v : a.positional) escape_strings(v);
      for (auto& [k, v] : a.keyword) escape_strings(v);
    }
    if (name == "join" && !a.positional.empty()) {
      List items;
      for (const Value& item : iterate(a.positional[0])) items.push_back(item.is_string() ? escape_to_markup(item) : item);
      a.positional[0] = Value(std::move(items));
    }
    Value result = fn.fn(a);
    if (result.is_string()) return Value::markup(result.as_string());
    if (!result.is_list()) return result;
    List parts;
    for (const Value& part : result.as_list()) parts.push_back(part.is_string() ? Value::markup(part.as_string()) : part);
    return Value(std::move(parts));
  });
}

Value get_method(const BuiltinContext& ctx, const Value& object, const std::string& name) {
  if (object.is_markup()) return markup_method(ctx, object, name);
  if (object.is_string()) return string_method(ctx, object.as_string(), name);
  if (object.is_dict()) return dict_method(object, name);
  return Value::undefined(std::string("'") + object.type_name() + "' object has no attribute '" + name + "'");
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_list() || object.is_string()) {
    if (key.is_int() || key.is_bool()) {
      if (object.is_list()) {
        const auto n = static_cast<int64_t>(object.as_list().size());
        const int64_t i = clamp_index(key.as_int(), n);
        if (i < 0 || i >= n) return Value::undefined("list index out of range");
        return object.as_list()[static_cast<size_t>(i)];
      }
      const std::vector<char32_t> cps = to_code_points(object.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      const int64_t i = clamp_index(key.as_int(), n);
      if (i < 0 || i >= n) return Value::undefined("string index out of range");
      std::string out;
      append_code_point(out, cps[static_cast<size_t>(i)]);
      return object.is_markup() ? Value::markup(std::move(out)) : Value(std::move(out));
    }
    return Value::undefined("no item");
  }
  if (object.is_dict() || object.is_namespace()) {
    if (!key.is_string()) return Value::undefined("no such key");
    if (const Value* v = object.find(key.as_string())) return *v;
    if (object.is_dict() && is_dict_method(key.as_string())) return dict_method(object, key.as_string());
    return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
  }
  return Value::undefined(std::string("'") + object.type_name() + "' object has no item");
}

Value get_attr(const BuiltinContext& ctx, const Value& object, const std::string& name) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict() && is_dict_method(name)) return dict_method(object, name);
  if (object.is_dict() || object.is_namespace()) return get_item(object, Value(name));
  if (object.is_string()) return get_method(ctx, object, name);
  return Value::undefined(std::string("'") + object.type_name() + "' object has no attribute '" + name + "'");
}

Dict make_globals(const BuiltinContext& ctx, const std::tm& now) {
  Dict globals;
  globals.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
    throw RenderFailure(ErrorKind::raised, a.positional.empty() ? "" : to_py_str(a.positional[0]));
  }));
  globals.emplace_back("strftime_now", Value::function("strftime_now", [now](CallArgs& a) {
    const std::string& format = require_string(arg_or(a, 0, "format", Value::none()), "strftime format");
    if (format.size() > 256) fail("strftime format too long");
    char buf[2048];
    const size_t n = format.empty() ? 0 : std::strftime(buf, sizeof buf, format.c_str(), &now);
    if (n == 0 && !format.empty()) fail("strftime result too long or empty");
    return Value(std::string(buf, n));
  }));
  std::vector<Value>* namespaces = ctx.namespaces;
  auto build_dict = [namespaces](CallArgs& a, bool is_namespace) {
    Dict attrs;
    if (!a.positional.empty()) {
      if (a.positional.size() > 1 || !a.positional[0].is_dict()) fail("expected a mapping argument");
      attrs = a.positional[0].as_dict();
    }
    for (const auto& kw : a.keyword) {
      auto it = std::find_if(attrs.begin(), attrs.end(), [&](const auto& p) { return p.first == kw.first; });
      if (it != attrs.end()) {
        it->second = kw.second;
      } else {
        attrs.push_back(kw);
      }
    }
    if (is_namespace) {
      for (const auto& [k, v] : attrs) {
        if (!k.empty() && k[0] == '_') fail("chat templates cannot store underscore-prefixed attributes on a namespace");
      }
      Value ns = Value::make_namespace(std::move(attrs));
      if (namespaces != nullptr) namespaces->push_back(ns);
      return ns;
    }
    return Value(std::move(attrs));
  };
  globals.emplace_back("namespace", Value::function("namespace", [build_dict](CallArgs& a) { return build_dict(a, true); }));
  globals.emplace_back("dict", Value::function("dict", [build_dict](CallArgs& a) { return build_dict(a, false); }));
  const RenderLimits* limits = &ctx.limits;
  globals.emplace_back("range", Value::function("range", [limits](CallArgs& a) {
    if (a.positional.empty() || a.positional.size() > 3) fail("range expects 1 to 3 integer arguments");
    int64_t start = 0;
    int64_t stop = 0;
    int64_t step = 1;
    if (a.positional.size() == 1) {
      stop = require_int(a.positional[0], "range argument");
    } else {
      start = require_int(a.positional[0], "range argument");
      stop = require_int(a.positional[1], "range argument");
      if (a.positional.size() == 3) step = require_int(a.positional[2], "range argument");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    // jinja2's sandbox refuses ranges longer than MAX_RANGE = 100000.
    const long double count = step > 0 ? (static_cast<long double>(stop) - start) / step
                                        : (static_cast<long double>(start) - stop) / -step;
    if (count > 100000 || count > static_cast<long double>(limits->max_loop_iterations)) {
      throw RenderFailure(ErrorKind::limit, "range too big: the sandbox allows at most 100000 items");
    }
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value(std::move(out));
  }));
  return globals;
}

}  // namespace fp8serve::jinja
