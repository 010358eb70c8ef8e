// The parser's class, shared by parser.cpp (statements) and parser_expressions.cpp
// (expressions, with jinja2's operator precedence). Internal to the chat_template library.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "model/chat_template/parser.hpp"

namespace fp8serve::jinja {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseLimits& limits)
      : toks_(std::move(tokens)), limits_(limits) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != TokenType::eof) error("unexpected '" + describe(cur()) + "'");
    return body;
  }

 private:
  // RAII nesting counter: deep input must be an error, not a stack overflow.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_nesting) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  [[noreturn]] void error(const std::string& message) const { throw TemplateError(message, cur().line); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::eof: return "end of template";
      case TokenType::variable_end: return "}}";
      case TokenType::block_end: return "%}";
      case TokenType::variable_begin: return "{{";
      case TokenType::block_begin: return "{%";
      case TokenType::data: return "text";
      default: return t.text;
    }
  }

  bool is_op(const char* op) const { return cur().type == TokenType::op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::name && cur().text == name; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "', got '" + describe(cur()) + "'");
    advance();
  }
  void expect_name(const char* name) {
    if (!is_name(name)) error(std::string("expected '") + name + "', got '" + describe(cur()) + "'");
    advance();
  }
  std::string expect_identifier() {
    if (cur().type != TokenType::name) error("expected a name, got '" + describe(cur()) + "'");
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::block_end) error("expected '%}', got '" + describe(cur()) + "'");
    advance();
  }

  // ---- statements (parser.cpp) ----
  // Statements until a {% name %} whose name is in end_names (left unconsumed after '{%').
  Body subparse(const std::vector<std::string>& end_names);
  // Consumes the end tag's name and '%}'.
  void end_tag(const char* name);
  StmtPtr parse_statement();
  std::vector<std::string> parse_target_names(const char* end_name);
  StmtPtr parse_for(int line);
  StmtPtr parse_if(int line);
  StmtPtr parse_set(int line);
  void parse_params(std::vector<MacroParam>& params);
  StmtPtr parse_macro(int line);
  StmtPtr parse_call_block(int line);
  StmtPtr parse_filter_block(int line);

  // ---- expressions (parser_expressions.cpp) ----
  ExprPtr make(Expr::Kind kind) { return std::make_unique<Expr>(kind, cur().line); }
  bool at_tuple_end(const std::vector<std::string>& extra_end) const;
  // A comma-separated list becomes a tuple (a list flagged is_tuple); one item stays itself.
  ExprPtr parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens);
  ExprPtr parse_expression(bool with_condexpr);
  ExprPtr parse_condexpr();
  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr object);
  void parse_call_args(Expr& node);
  ExprPtr parse_call(ExprPtr callee);
  std::string dotted_name();
  ExprPtr parse_filter(ExprPtr object, bool start_inline);
  ExprPtr parse_test(ExprPtr object);

  std::vector<Token> toks_;
  ParseLimits limits_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace fp8serve::jinja
