#include "model/chat_template/interpreter.hpp"

#include <algorithm>
#include <memory>

#include "model/chat_template/builtin_args.hpp"
#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

Value* Interpreter::Scope::find_local(const std::string& name) {
  for (auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Interpreter::Scope::set(const std::string& name, Value value) {
  if (Value* v = find_local(name)) {
    *v = std::move(value);
  } else {
    vars.emplace_back(name, std::move(value));
  }
}

Interpreter::Interpreter(const RenderLimits& limits, const std::tm& now, Dict variables)
    : limits_(limits), ctx_{limits_, &namespaces_} {
  for (auto& [k, v] : make_globals(ctx_, now)) root_.set(k, std::move(v));
  for (auto& [k, v] : variables) root_.set(k, std::move(v));
}

Interpreter::~Interpreter() {
  // {% set ns.self = ns %} makes a shared_ptr cycle; emptying every namespace breaks it.
  for (Value& ns : namespaces_) ns.namespace_attrs().clear();
}

std::string Interpreter::render(const Body& body) {
  std::string out;
  exec(body, root_, out);
  return out;
}

void Interpreter::emit(std::string& out, const std::string& text) const {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    throw RenderFailure(ErrorKind::limit, "rendered prompt exceeds the limit of " +
                                              std::to_string(limits_.max_output_bytes) + " bytes");
  }
  out += text;
}

void Interpreter::count_iteration() {
  if (++iterations_ > limits_.max_loop_iterations) {
    throw RenderFailure(ErrorKind::limit, "template ran more than " +
                                              std::to_string(limits_.max_loop_iterations) + " loop iterations");
  }
}

Interpreter::Flow Interpreter::exec(const Body& body, Scope& scope, std::string& out) {
  for (const StmtPtr& stmt : body) {
    const Flow flow = exec_stmt(*stmt, scope, out);
    if (flow != Flow::normal) return flow;
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& stmt, Scope& scope, std::string& out) {
  switch (stmt.kind) {
    case Stmt::Kind::text:
      emit(out, stmt.text);
      return Flow::normal;
    case Stmt::Kind::output:
      emit(out, to_py_str(eval(*stmt.expr, scope)));
      return Flow::normal;
    case Stmt::Kind::if_:
      for (const auto& [condition, body] : stmt.branches) {
        if (eval(*condition, scope).truthy()) return exec(body, scope, out);
      }
      return exec(stmt.else_body, scope, out);
    case Stmt::Kind::for_:
      exec_for(stmt, scope, out);
      return Flow::normal;
    case Stmt::Kind::set:
      exec_set(stmt, scope);
      return Flow::normal;
    case Stmt::Kind::set_block: {
      std::string captured;
      exec(stmt.body, scope, captured);
      Value v(std::move(captured));
      if (stmt.filter) v = apply_filter_chain(*stmt.filter, &v, scope);
      scope.set(stmt.targets[0], std::move(v));
      return Flow::normal;
    }
    case Stmt::Kind::macro:
      scope.set(stmt.name, make_macro(stmt));
      return Flow::normal;
    case Stmt::Kind::call_block:
      exec_call_block(stmt, scope, out);
      return Flow::normal;
    case Stmt::Kind::filter_block: {
      std::string captured;
      exec(stmt.body, scope, captured);
      const Value body(std::move(captured));
      emit(out, to_py_str(apply_filter_chain(*stmt.filter, &body, scope)));
      return Flow::normal;
    }
    case Stmt::Kind::break_:
      return Flow::break_loop;
    case Stmt::Kind::continue_:
      return Flow::continue_loop;
    case Stmt::Kind::scope:
      return exec(stmt.body, scope, out);
  }
  return Flow::normal;
}

void Interpreter::bind_targets(const std::vector<std::string>& targets, const Value& item, Scope& scope) {
  if (targets.size() == 1) {
    scope.set(targets[0], item);
    return;
  }
  const List parts = iterate(item);
  if (parts.size() != targets.size()) {
    fail(parts.size() < targets.size() ? "not enough values to unpack" : "too many values to unpack");
  }
  for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], parts[i]);
}

void Interpreter::exec_for(const Stmt& stmt, Scope& scope, std::string& out) {
  List items = iterate(eval(*stmt.expr, scope));
  if (stmt.condition) {  // {% for x in xs if cond %}: loop.* counts only the kept items
    List kept;
    for (const Value& item : items) {
      count_iteration();
      Scope tmp{&scope, {}};
      bind_targets(stmt.targets, item, tmp);
      if (eval(*stmt.condition, tmp).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    count_iteration();
    Scope iteration{&scope, {}};
    bind_targets(stmt.targets, items[static_cast<size_t>(i)], iteration);
    Dict loop;
    loop.emplace_back("index0", Value(i));
    loop.emplace_back("index", Value(i + 1));
    loop.emplace_back("revindex0", Value(n - i - 1));
    loop.emplace_back("revindex", Value(n - i));
    loop.emplace_back("first", Value(i == 0));
    loop.emplace_back("last", Value(i == n - 1));
    loop.emplace_back("length", Value(n));
    loop.emplace_back("depth", Value(int64_t{1}));
    loop.emplace_back("depth0", Value(int64_t{0}));
    loop.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
    loop.emplace_back("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
    loop.emplace_back("cycle", Value::function("loop.cycle", [i](CallArgs& a) {
      if (a.positional.empty()) fail("no items for cycling given");
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    }));
    iteration.set("loop", Value(std::move(loop)));
    if (exec(stmt.body, iteration, out) == Flow::break_loop) break;
  }
  if (n == 0) exec(stmt.else_body, scope, out);
}

void Interpreter::exec_set(const Stmt& stmt, Scope& scope) {
  Value v = eval(*stmt.expr, scope);
  if (!stmt.ns_target.empty()) {
    Value ns = lookup(stmt.ns_target, scope);
    if (!ns.is_namespace()) fail("cannot assign attribute on non-namespace object '" + stmt.ns_target + "'");
    const std::string& attr = stmt.targets[0];
    if (!attr.empty() && attr[0] == '_') fail("chat templates cannot store underscore-prefixed attributes on a namespace");
    Dict& attrs = ns.namespace_attrs();
    for (auto& [k, old] : attrs) {
      if (k == attr) {
        old = std::move(v);
        return;
      }
    }
    attrs.emplace_back(attr, std::move(v));
    return;
  }
  bind_targets(stmt.targets, v, scope);
}

Value Interpreter::make_macro(const Stmt& stmt) {
  // Macros see the root scope (top-level variables and globals) plus their arguments.
  const Stmt* macro = &stmt;
  return Value::function(stmt.name, [this, macro](CallArgs& args) {
    if (++call_depth_ > limits_.max_call_depth) {
      throw RenderFailure(ErrorKind::limit, "macro recursion deeper than " + std::to_string(limits_.max_call_depth));
    }
    struct DepthRestore {
      int& depth;
      ~DepthRestore() { --depth; }
    } restore{call_depth_};
    if (args.positional.size() > macro->params.size()) {
      fail("macro '" + macro->name + "' takes not more than " + std::to_string(macro->params.size()) + " argument(s)");
    }
    Scope local{&root_, {}};
    bind_params(macro->params, args, local);
    for (const auto& kw : args.keyword) {
      const std::string& key = kw.first;
      const bool known = key == "caller" || std::any_of(macro->params.begin(), macro->params.end(),
                                                        [&](const MacroParam& p) { return p.name == key; });
      if (!known) fail("macro '" + macro->name + "' takes no keyword argument '" + key + "'");
      if (key == "caller") local.set(key, kw.second);
    }
    std::string out;
    exec(macro->body, local, out);
    return Value(std::move(out));
  });
}

// Binds a macro's (or call block's) parameters in `local`: positional arguments first, then
// keywords, then defaults (evaluated in `local`, so a default may use earlier parameters), and an
// undefined value for a parameter given nothing, as jinja2 does.
void Interpreter::bind_params(const std::vector<MacroParam>& params, CallArgs& args, Scope& local) {
  for (size_t i = 0; i < params.size(); ++i) {
    const MacroParam& p = params[i];
    if (i < args.positional.size()) {
      local.set(p.name, args.positional[i]);
    } else if (const Value* kw = args.keyword_arg(p.name)) {
      local.set(p.name, *kw);
    } else if (p.default_value) {
      local.set(p.name, eval(*p.default_value, local));
    } else {
      local.set(p.name, Value::undefined("'" + p.name + "' is undefined"));
    }
  }
}

void Interpreter::exec_call_block(const Stmt& stmt, Scope& scope, std::string& out) {
  // caller() renders the call block's body; it must not outlive this statement's scope.
  auto alive = std::make_shared<bool>(true);
  const Stmt* block = &stmt;
  Scope* outer = &scope;
  Value caller = Value::function("caller", [this, block, outer, alive](CallArgs& args) {
    if (!*alive) fail("caller() used outside of its call block");
    Scope local{outer, {}};
    bind_params(block->params, args, local);
    std::string body;
    exec(block->body, local, body);
    return Value(std::move(body));
  });
  const Expr& call = *stmt.expr;
  const Value callee = eval(*call.object, scope);
  if (!callee.is_callable()) fail("'call' block needs a macro to call");
  CallArgs args = eval_args(call, scope);
  args.keyword.emplace_back("caller", caller);
  std::string result;
  try {
    result = to_py_str(callee.as_callable().fn(args));
  } catch (...) {
    *alive = false;
    throw;
  }
  *alive = false;
  emit(out, result);
}

Value Interpreter::lookup(const std::string& name, Scope& scope) {
  for (Scope* s = &scope; s != nullptr; s = s->parent) {
    if (Value* v = s->find_local(name)) return *v;
  }
  return Value::undefined("'" + name + "' is undefined");
}

CallArgs Interpreter::eval_args(const Expr& expr, Scope& scope) {
  CallArgs args;
  for (const ExprPtr& a : expr.args) args.positional.push_back(eval(*a, scope));
  for (const KeywordArg& kw : expr.kwargs) args.keyword.emplace_back(kw.name, eval(*kw.value, scope));
  return args;
}

Value Interpreter::apply_filter_chain(const Expr& filter, const Value* block_input, Scope& scope) {
  // In a {% filter %} or {% set x | f %} block the innermost filter has no object: its input is
  // the rendered body. In expressions every filter has an object.
  Value inner;
  if (filter.object == nullptr) {
    inner = *block_input;
  } else if (filter.object->kind == Expr::Kind::filter) {
    inner = apply_filter_chain(*filter.object, block_input, scope);
  } else {
    inner = eval(*filter.object, scope);
  }
  CallArgs args = eval_args(filter, scope);
  return apply_filter(ctx_, filter.name, inner, args);
}

Value Interpreter::eval(const Expr& expr, Scope& scope) {
  switch (expr.kind) {
    case Expr::Kind::literal:
      return expr.value;
    case Expr::Kind::name:
      return lookup(expr.name, scope);
    case Expr::Kind::list: {
      List items;
      items.reserve(expr.items.size());
      for (const ExprPtr& e : expr.items) items.push_back(eval(*e, scope));
      return expr.is_tuple ? Value::tuple(std::move(items)) : Value(std::move(items));
    }
    case Expr::Kind::dict: {
      Dict items;
      for (size_t i = 0; i + 1 < expr.items.size(); i += 2) {
        const Value key = eval(*expr.items[i], scope);
        if (!key.is_string()) fail("dict literals in chat templates must have string keys");
        Value v = eval(*expr.items[i + 1], scope);
        bool replaced = false;
        for (auto& [k, old] : items) {
          if (k == key.as_string()) {
            old = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(key.as_string(), std::move(v));
      }
      return Value(std::move(items));
    }
    case Expr::Kind::get_attr:
      return get_attr(ctx_, eval(*expr.object, scope), expr.name);
    case Expr::Kind::get_item: {
      const Value object = eval(*expr.object, scope);
      const Value key = eval(*expr.left, scope);
      Value v = get_item(object, key);
      // jinja2's getitem falls back to getattr for string keys: 'abc'['upper'] is a method.
      if (v.is_undefined() && key.is_string() && object.is_string()) return get_attr(ctx_, object, key.as_string());
      return v;
    }
    case Expr::Kind::slice:
      return eval_slice(expr, scope);
    case Expr::Kind::call: {
      const Value callee = eval(*expr.object, scope);
      if (callee.is_undefined()) fail_undefined(callee);
      if (!callee.is_callable()) fail(std::string("'") + callee.type_name() + "' object is not callable");
      CallArgs args = eval_args(expr, scope);
      return callee.as_callable().fn(args);
    }
    case Expr::Kind::filter:
      return apply_filter_chain(expr, nullptr, scope);
    case Expr::Kind::test: {
      const Value subject = eval(*expr.object, scope);
      CallArgs args = eval_args(expr, scope);
      return Value(apply_test(ctx_, expr.name, subject, args) != expr.negated);
    }
    case Expr::Kind::unary: {
      const Value v = eval(*expr.object, scope);
      if (expr.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) fail("bad operand type for unary " + expr.name + ": '" + v.type_name() + "'");
      if (expr.name == "+") return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value(-v.as_int());
    }
    case Expr::Kind::binary:
      return eval_binary(expr, scope);
    case Expr::Kind::compare:
      return Value(eval_compare(expr, scope));
    case Expr::Kind::conditional:
      if (eval(*expr.condition, scope).truthy()) return eval(*expr.then, scope);
      return expr.otherwise ? eval(*expr.otherwise, scope) : Value::undefined("conditional expression had no else branch");
  }
  return Value();
}

}  // namespace fp8serve::jinja
