// Renders a parsed template: a tree walk over statements and expressions with jinja2's scoping
// (each loop iteration and macro call gets its own scope; if-blocks do not) and the sandbox
// limits on output size, loop iterations and macro recursion.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/chat_template/ast.hpp"
#include "model/chat_template/builtins.hpp"

namespace fp8serve::jinja {

class Interpreter {
 public:
  // `variables` are the render's context (messages, add_generation_prompt, ...) on top of
  // the globals; both live in the root scope.
  Interpreter(const RenderLimits& limits, const std::tm& now, Dict variables);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Throws RenderFailure.
  std::string render(const Body& body);

 private:
  struct Scope {
    Scope* parent = nullptr;
    std::vector<std::pair<std::string, Value>> vars;
    Value* find_local(const std::string& name);
    void set(const std::string& name, Value value);
  };
  enum class Flow { normal, break_loop, continue_loop };

  Flow exec(const Body& body, Scope& scope, std::string& out);
  Flow exec_stmt(const Stmt& stmt, Scope& scope, std::string& out);
  void exec_for(const Stmt& stmt, Scope& scope, std::string& out);
  void exec_set(const Stmt& stmt, Scope& scope);
  void exec_call_block(const Stmt& stmt, Scope& scope, std::string& out);
  void bind_params(const std::vector<MacroParam>& params, CallArgs& args, Scope& local);
  Value make_macro(const Stmt& stmt);
  void bind_targets(const std::vector<std::string>& targets, const Value& item, Scope& scope);

  Value eval(const Expr& expr, Scope& scope);
  Value eval_binary(const Expr& expr, Scope& scope);
  bool eval_compare(const Expr& expr, Scope& scope);
  Value eval_slice(const Expr& expr, Scope& scope);
  Value apply_filter_chain(const Expr& filter, const Value* block_input, Scope& scope);
  CallArgs eval_args(const Expr& expr, Scope& scope);
  Value lookup(const std::string& name, Scope& scope);

  void emit(std::string& out, const std::string& text) const;
  void count_iteration();

  RenderLimits limits_;
  std::vector<Value> namespaces_;
  BuiltinContext ctx_;
  Scope root_;
  uint64_t iterations_ = 0;
  int call_depth_ = 0;
};

}  // namespace fp8serve::jinja
