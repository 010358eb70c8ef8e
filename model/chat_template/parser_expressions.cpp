// Expressions, following jinja2.parser: condexpr > or > and > not > compare > + - > ~ > * / // % >
// ** > unary - + > primary with postfix (.attr, [item], call) and filters (|f, is test).
#include "model/chat_template/parser_impl.hpp"

namespace fp8serve::jinja {

bool Parser::at_tuple_end(const std::vector<std::string>& extra_end) const {
  const Token& t = cur();
  if (t.type == TokenType::variable_end || t.type == TokenType::block_end || t.type == TokenType::eof) return true;
  if (t.type == TokenType::op && t.text == ")") return true;
  if (t.type == TokenType::name) {
    return std::find(extra_end.begin(), extra_end.end(), t.text) != extra_end.end();
  }
  return false;
}

ExprPtr Parser::parse_tuple(bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens) {
  auto tuple = make(Expr::Kind::list);
  bool is_tuple = false;
  while (true) {
    if (!tuple->items.empty()) expect_op(",");
    if (at_tuple_end(extra_end)) break;
    tuple->items.push_back(parse_expression(with_condexpr));
    if (is_op(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!tuple->items.empty()) return std::move(tuple->items[0]);
    if (!explicit_parens) error("expected an expression, got '" + describe(cur()) + "'");
  }
  tuple->is_tuple = true;
  return tuple;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  return with_condexpr ? parse_condexpr() : parse_or();
}

ExprPtr Parser::parse_condexpr() {
  ExprPtr expr = parse_or();
  while (is_name("if")) {
    auto node = make(Expr::Kind::conditional);
    advance();
    node->condition = parse_or();
    if (is_name("else")) {
      advance();
      node->otherwise = parse_condexpr();
    }
    node->then = std::move(expr);
    expr = std::move(node);
  }
  return expr;
}

ExprPtr Parser::binary(const std::string& op, ExprPtr left, ExprPtr right) {
  auto node = std::make_unique<Expr>(Expr::Kind::binary, left->line);
  node->name = op;
  node->left = std::move(left);
  node->right = std::move(right);
  return node;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (is_name("or")) {
    advance();
    left = binary("or", std::move(left), parse_and());
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (is_name("and")) {
    advance();
    left = binary("and", std::move(left), parse_not());
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(*this);
    auto node = make(Expr::Kind::unary);
    advance();
    node->name = "not";
    node->object = parse_not();
    return node;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  ExprPtr expr = parse_math1();
  std::vector<std::pair<std::string, ExprPtr>> chain;
  while (true) {
    static const char* const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    std::string op;
    for (const char* o : ops) {
      if (is_op(o)) op = o;
    }
    if (!op.empty()) {
      advance();
    } else if (is_name("in")) {
      advance();
      op = "in";
    } else if (is_name("not") && peek().type == TokenType::name && peek().text == "in") {
      advance();
      advance();
      op = "not in";
    } else {
      break;
    }
    chain.emplace_back(op, parse_math1());
  }
  if (chain.empty()) return expr;
  auto node = std::make_unique<Expr>(Expr::Kind::compare, expr->line);
  node->left = std::move(expr);
  node->chain = std::move(chain);
  return node;
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (is_op("+") || is_op("-")) {
    const std::string op = cur().text;
    advance();
    left = binary(op, std::move(left), parse_concat());
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (is_op("~")) {
    advance();
    left = binary("~", std::move(left), parse_math2());
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = cur().text;
    advance();
    left = binary(op, std::move(left), parse_pow());
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (is_op("**")) {
    advance();
    left = binary("**", std::move(left), parse_unary(true));
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    node = make(Expr::Kind::unary);
    node->name = cur().text;
    advance();
    node->object = parse_unary(false);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& t = cur();
  if (t.type == TokenType::name) {
    auto node = make(Expr::Kind::literal);
    if (t.text == "true" || t.text == "True") {
      node->value = Value(true);
    } else if (t.text == "false" || t.text == "False") {
      node->value = Value(false);
    } else if (t.text == "none" || t.text == "None") {
      node->value = Value::none();
    } else {
      node->kind = Expr::Kind::name;
      node->name = t.text;
    }
    advance();
    return node;
  }
  if (t.type == TokenType::string) {
    auto node = make(Expr::Kind::literal);
    std::string s;
    while (cur().type == TokenType::string) {  // adjacent literals concatenate, as in Python
      s += cur().text;
      advance();
    }
    node->value = Value(std::move(s));
    return node;
  }
  if (t.type == TokenType::integer || t.type == TokenType::floating) {
    auto node = make(Expr::Kind::literal);
    node->value = t.type == TokenType::integer ? Value(t.int_value) : Value(t.float_value);
    advance();
    return node;
  }
  if (is_op("(")) {
    advance();
    ExprPtr inner = parse_tuple(true, {}, true);
    expect_op(")");
    return inner;
  }
  if (is_op("[")) {
    auto node = make(Expr::Kind::list);
    advance();
    while (!is_op("]")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("]")) break;
      node->items.push_back(parse_expression(true));
    }
    advance();
    return node;
  }
  if (is_op("{")) {
    auto node = make(Expr::Kind::dict);
    advance();
    while (!is_op("}")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("}")) break;
      node->items.push_back(parse_expression(true));
      expect_op(":");
      node->items.push_back(parse_expression(true));
    }
    advance();
    return node;
  }
  error("unexpected '" + describe(t) + "'");
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (is_op(".") || is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (is_op("|")) {
      node = parse_filter(std::move(node), false);
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr object) {
  DepthGuard guard(*this);
  if (is_op(".")) {
    advance();
    if (cur().type == TokenType::name) {
      auto node = make(Expr::Kind::get_attr);
      node->name = cur().text;
      node->object = std::move(object);
      advance();
      return node;
    }
    if (cur().type == TokenType::integer) {
      auto node = make(Expr::Kind::get_item);
      auto index = make(Expr::Kind::literal);
      index->value = Value(cur().int_value);
      node->object = std::move(object);
      node->left = std::move(index);
      advance();
      return node;
    }
    error("expected a name after '.'");
  }
  advance();  // '['
  ExprPtr parts[3];
  bool is_slice = false;
  if (!is_op(":")) parts[0] = parse_expression(true);
  if (is_op(":")) {
    is_slice = true;
    advance();
    if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
    if (is_op(":")) {
      advance();
      if (!is_op("]")) parts[2] = parse_expression(true);
    }
  }
  expect_op("]");
  if (!is_slice) {
    auto node = std::make_unique<Expr>(Expr::Kind::get_item, object->line);
    node->object = std::move(object);
    node->left = std::move(parts[0]);
    return node;
  }
  auto node = std::make_unique<Expr>(Expr::Kind::slice, object->line);
  node->object = std::move(object);
  for (int i = 0; i < 3; ++i) node->slice_parts[i] = std::move(parts[i]);
  return node;
}

void Parser::parse_call_args(Expr& node) {
  expect_op("(");
  while (!is_op(")")) {
    if (!node.args.empty() || !node.kwargs.empty()) expect_op(",");
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) error("*args and **kwargs are not supported in chat templates");
    if (cur().type == TokenType::name && peek().type == TokenType::op && peek().text == "=") {
      KeywordArg kw;
      kw.name = cur().text;
      advance();
      advance();
      kw.value = parse_expression(true);
      node.kwargs.push_back(std::move(kw));
    } else {
      if (!node.kwargs.empty()) error("positional argument after keyword argument");
      node.args.push_back(parse_expression(true));
    }
  }
  advance();
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  DepthGuard guard(*this);
  auto node = std::make_unique<Expr>(Expr::Kind::call, callee->line);
  node->object = std::move(callee);
  parse_call_args(*node);
  return node;
}

std::string Parser::dotted_name() {
  std::string name = expect_identifier();
  while (is_op(".")) {
    advance();
    name += '.';
    name += expect_identifier();
  }
  return name;
}

ExprPtr Parser::parse_filter(ExprPtr object, bool start_inline) {
  while (is_op("|") || start_inline) {
    DepthGuard guard(*this);
    if (!start_inline) advance();
    start_inline = false;
    auto node = make(Expr::Kind::filter);
    node->name = dotted_name();
    if (is_op("(")) parse_call_args(*node);
    node->object = std::move(object);
    object = std::move(node);
  }
  return object;
}

ExprPtr Parser::parse_test(ExprPtr object) {
  DepthGuard guard(*this);
  auto node = make(Expr::Kind::test);
  advance();  // 'is'
  if (is_name("not")) {
    advance();
    node->negated = true;
  }
  node->name = dotted_name();
  if (is_op("(")) {
    parse_call_args(*node);
  } else {
    const Token& t = cur();
    const bool arg_start =
        t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
        t.type == TokenType::floating || (t.type == TokenType::op && (t.text == "(" || t.text == "[" || t.text == "{"));
    if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) error("you cannot chain multiple tests with 'is'");
      node->args.push_back(parse_postfix(parse_primary()));
    }
  }
  node->object = std::move(object);
  return node;
}

}  // namespace fp8serve::jinja
