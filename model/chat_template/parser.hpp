// Builds the syntax tree from the token stream, following jinja2's grammar and operator
// precedence. Any malformed template is a TemplateError here, at load time.
#pragma once

#include <string_view>

#include "model/chat_template/ast.hpp"
#include "model/chat_template/lexer.hpp"

namespace fp8serve::jinja {

struct ParseLimits {
  int max_nesting = 128;  // expression and block nesting; keeps the recursive parser bounded
};

Body parse_template(std::string_view source, const ParseLimits& limits = {});

}  // namespace fp8serve::jinja
