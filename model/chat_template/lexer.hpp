// Splits a template into data and tag tokens the way jinja2's lexer does with the options
// transformers uses (trim_blocks=True, lstrip_blocks=True): whitespace control with '-' and '+',
// comments dropped, {% raw %} kept verbatim, and expression tokens inside {{ }} and {% %}.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve::jinja {

// A template that cannot be parsed: raised at load time, never while serving a request.
class TemplateError : public std::runtime_error {
 public:
  TemplateError(const std::string& message, int line)
      : std::runtime_error("chat template line " + std::to_string(line) + ": " + message),
        line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

enum class TokenType {
  data,
  variable_begin,
  variable_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct Token {
  TokenType type = TokenType::eof;
  std::string text;  // data text, name, decoded string literal, or operator
  int64_t int_value = 0;
  double float_value = 0.0;
  int line = 1;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options = {});

}  // namespace fp8serve::jinja
