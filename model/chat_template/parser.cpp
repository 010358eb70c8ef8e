#include "model/chat_template/parser_impl.hpp"

namespace fp8serve::jinja {

Body Parser::subparse(const std::vector<std::string>& end_names) {
  DepthGuard guard(*this);
  Body body;
  while (true) {
    const Token& t = cur();
    if (t.type == TokenType::eof) {
      if (!end_names.empty()) error("unexpected end of template, expected '" + end_names.back() + "'");
      return body;
    }
    if (t.type == TokenType::data) {
      auto s = std::make_unique<Stmt>(Stmt::Kind::text, t.line);
      s->text = t.text;
      body.push_back(std::move(s));
      advance();
    } else if (t.type == TokenType::variable_begin) {
      advance();
      auto s = std::make_unique<Stmt>(Stmt::Kind::output, t.line);
      s->expr = parse_tuple(true, {}, false);
      if (cur().type != TokenType::variable_end) error("expected '}}', got '" + describe(cur()) + "'");
      advance();
      body.push_back(std::move(s));
    } else if (t.type == TokenType::block_begin) {
      const Token& name = peek();
      if (name.type == TokenType::name &&
          std::find(end_names.begin(), end_names.end(), name.text) != end_names.end()) {
        advance();
        return body;
      }
      advance();
      body.push_back(parse_statement());
    } else {
      error("unexpected '" + describe(t) + "'");
    }
  }
}

void Parser::end_tag(const char* name) {
  expect_name(name);
  expect_block_end();
}

StmtPtr Parser::parse_statement() {
  if (cur().type != TokenType::name) error("tag name expected");
  const std::string keyword = cur().text;
  const int line = cur().line;
  advance();
  if (keyword == "for") return parse_for(line);
  if (keyword == "if") return parse_if(line);
  if (keyword == "set") return parse_set(line);
  if (keyword == "macro") return parse_macro(line);
  if (keyword == "call") return parse_call_block(line);
  if (keyword == "filter") return parse_filter_block(line);
  if (keyword == "generation") {
    auto s = std::make_unique<Stmt>(Stmt::Kind::scope, line);
    expect_block_end();
    s->body = subparse({"endgeneration"});
    end_tag("endgeneration");
    return s;
  }
  if (keyword == "break" || keyword == "continue") {
    if (loop_depth_ == 0) error("'" + keyword + "' outside of a loop");
    expect_block_end();
    return std::make_unique<Stmt>(keyword == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_, line);
  }
  static const char* const unsupported[] = {"include", "import", "from", "extends", "block",
                                            "with", "autoescape", "do", "trans"};
  for (const char* u : unsupported) {
    if (keyword == u) error("'" + keyword + "' is not supported in chat templates");
  }
  error("unknown tag '" + keyword + "'");
}

std::vector<std::string> Parser::parse_target_names(const char* end_name) {
  std::vector<std::string> names;
  const bool paren = is_op("(");
  if (paren) advance();
  while (true) {
    names.push_back(expect_identifier());
    if (!is_op(",")) break;
    advance();
    if ((paren && is_op(")")) || is_name(end_name)) break;
  }
  if (paren) expect_op(")");
  return names;
}

StmtPtr Parser::parse_for(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::for_, line);
  s->targets = parse_target_names("in");
  expect_name("in");
  s->expr = parse_tuple(false, {"recursive"}, false);
  if (is_name("if")) {
    advance();
    s->condition = parse_expression(true);
  }
  if (is_name("recursive")) error("recursive loops are not supported in chat templates");
  expect_block_end();
  ++loop_depth_;
  s->body = subparse({"endfor", "else"});
  --loop_depth_;
  if (is_name("else")) {
    advance();
    expect_block_end();
    s->else_body = subparse({"endfor"});
  }
  end_tag("endfor");
  return s;
}

StmtPtr Parser::parse_if(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::if_, line);
  while (true) {
    ExprPtr cond = parse_tuple(false, {}, false);
    expect_block_end();
    Body body = subparse({"elif", "else", "endif"});
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (is_name("elif")) {
      advance();
      continue;
    }
    if (is_name("else")) {
      advance();
      expect_block_end();
      s->else_body = subparse({"endif"});
    }
    break;
  }
  end_tag("endif");
  return s;
}

StmtPtr Parser::parse_set(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::set, line);
  const std::string first = expect_identifier();
  if (is_op(".")) {
    advance();
    s->ns_target = first;
    s->targets.push_back(expect_identifier());
  } else {
    s->targets.push_back(first);
    while (is_op(",")) {
      advance();
      if (is_op("=")) break;
      s->targets.push_back(expect_identifier());
    }
  }
  if (is_op("=")) {
    advance();
    s->expr = parse_tuple(true, {}, false);
    expect_block_end();
    return s;
  }
  if (s->targets.size() != 1 || !s->ns_target.empty()) error("expected '='");
  s->kind = Stmt::Kind::set_block;
  if (is_op("|")) s->filter = parse_filter(nullptr, false);
  expect_block_end();
  s->body = subparse({"endset"});
  end_tag("endset");
  return s;
}

void Parser::parse_params(std::vector<MacroParam>& params) {
  expect_op("(");
  while (!is_op(")")) {
    if (!params.empty()) expect_op(",");
    if (is_op(")")) break;
    MacroParam p;
    p.name = expect_identifier();
    if (is_op("=")) {
      advance();
      p.default_value = parse_expression(true);
    } else if (!params.empty() && params.back().default_value != nullptr) {
      error("non-default argument follows default argument");
    }
    params.push_back(std::move(p));
  }
  advance();
}

StmtPtr Parser::parse_macro(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::macro, line);
  s->name = expect_identifier();
  parse_params(s->params);
  expect_block_end();
  const int saved_loops = loop_depth_;
  loop_depth_ = 0;
  s->body = subparse({"endmacro"});
  loop_depth_ = saved_loops;
  end_tag("endmacro");
  return s;
}

StmtPtr Parser::parse_call_block(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::call_block, line);
  if (is_op("(")) parse_params(s->params);
  s->expr = parse_expression(true);
  if (s->expr->kind != Expr::Kind::call) error("expected a call after 'call'");
  expect_block_end();
  s->body = subparse({"endcall"});
  end_tag("endcall");
  return s;
}

StmtPtr Parser::parse_filter_block(int line) {
  auto s = std::make_unique<Stmt>(Stmt::Kind::filter_block, line);
  s->filter = parse_filter(nullptr, true);
  expect_block_end();
  s->body = subparse({"endfilter"});
  end_tag("endfilter");
  return s;
}

Body parse_template(std::string_view source, const ParseLimits& limits) {
  return Parser(tokenize(source), limits).parse_all();
}

}  // namespace fp8serve::jinja
