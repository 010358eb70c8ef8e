#include "model/chat_template/lexer.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "model/chat_template/py_str.hpp"

namespace fp8serve::jinja {

namespace {

enum class TagKind { variable, block, comment };

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options)
      : src_(std::move(source)), options_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t open = find_tag_open(pos_);
      std::string text = src_.substr(pos_, open - pos_);
      if (open == src_.size()) {
        emit_data(std::move(text));
        break;
      }
      const char c = src_[open + 1];
      const TagKind kind = c == '{' ? TagKind::variable : (c == '%' ? TagKind::block : TagKind::comment);
      char sign = 0;
      if (open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')) {
        sign = src_[open + 2];
      }
      text = strip_before_tag(std::move(text), kind, sign);
      emit_data(std::move(text));
      count_lines(pos_, open);
      pos_ = open + 2 + (sign != 0 ? 1 : 0);
      if (kind == TagKind::comment) {
        skip_comment();
      } else if (kind == TagKind::block && try_raw_block(sign)) {
        continue;
      } else {
        lex_tag(kind);
      }
    }
    tokens_.push_back(Token{TokenType::eof, "", 0, 0.0, line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& message) const { throw TemplateError(message, line_); }

  size_t find_tag_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) {
      if (src_[i] == '\n') ++line_;
    }
  }

  std::string strip_before_tag(std::string text, TagKind kind, char sign) const {
    if (sign == '-') return py_strip(text, nullptr, false, true);
    if (sign == '+' || !options_.lstrip_blocks || kind == TagKind::variable) return text;
    // lstrip_blocks: drop spaces and tabs between the start of the line and a block or comment.
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting_) return text;
    const std::string tail = text.substr(l_pos);
    if (tail.empty()) return text;
    for (char32_t c : to_code_points(tail)) {
      if (!is_py_space(c)) return text;
    }
    return text.substr(0, l_pos);
  }

  void emit_data(std::string text) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::data, std::move(text), 0, 0.0, line_});
  }

  // After a closing tag: '-' eats all following whitespace; trim_blocks eats one newline
  // (block and comment tags only); '+' keeps everything.
  void after_tag_end(char sign, bool block_like) {
    size_t start = pos_;
    if (sign == '-') {
      const std::vector<char32_t> rest = to_code_points(std::string_view(src_).substr(pos_));
      size_t skip_bytes = 0;
      for (char32_t c : rest) {
        if (!is_py_space(c)) break;
        std::string enc;
        append_code_point(enc, c);
        skip_bytes += enc.size();
      }
      pos_ += skip_bytes;
    } else if (sign != '+' && block_like && options_.trim_blocks && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
    count_lines(start, pos_);
  }

  void skip_comment() {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) error("missing end of comment tag");
    char sign = 0;
    if (close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+')) sign = src_[close - 1];
    count_lines(pos_, close);
    pos_ = close + 2;
    line_starting_ = false;
    after_tag_end(sign, true);
  }

  // {% raw %}...{% endraw %}: the body is data, not template code.
  bool try_raw_block(char open_sign) {
    (void)open_sign;
    size_t p = pos_;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    char sign = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    count_lines(pos_, p + 2);
    pos_ = p + 2;
    after_tag_end(sign, true);
    // Find {%[-+]? endraw [-+]?%}
    size_t search = pos_;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) error("missing end of raw directive");
      size_t q = open + 2;
      char inner_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) inner_sign = src_[q++];
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        q += 6;
        while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
        char end_sign = 0;
        if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
        if (src_.compare(q, 2, "%}") == 0) {
          std::string body = src_.substr(pos_, open - pos_);
          if (inner_sign == '-') body = py_strip(body, nullptr, false, true);
          emit_data(std::move(body));
          count_lines(pos_, q + 2);
          pos_ = q + 2;
          after_tag_end(end_sign, true);
          return true;
        }
      }
      search = open + 2;
    }
  }

  void push(TokenType type, std::string text) {
    tokens_.push_back(Token{type, std::move(text), 0, 0.0, line_});
  }

  void lex_tag(TagKind kind) {
    push(kind == TagKind::variable ? TokenType::variable_begin : TokenType::block_begin, "");
    std::vector<char> balance;
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_]))) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) error(kind == TagKind::variable ? "unexpected end of template, expected '}}'"
                                                             : "unexpected end of template, expected '%}'");
      if (balance.empty() && try_tag_end(kind)) return;
      lex_token(balance);
    }
  }

  bool try_tag_end(TagKind kind) {
    const char* close = kind == TagKind::variable ? "}}" : "%}";
    char sign = 0;
    size_t p = pos_;
    if (src_[p] == '-' || (src_[p] == '+' && kind == TagKind::block)) {
      if (src_.compare(p + 1, 2, close) != 0) return false;
      sign = src_[p];
      p += 1;
    } else if (src_.compare(p, 2, close) != 0) {
      return false;
    }
    pos_ = p + 2;
    push(kind == TagKind::variable ? TokenType::variable_end : TokenType::block_end, "");
    line_starting_ = false;
    after_tag_end(sign, kind == TagKind::block);
    return true;
  }

  void lex_token(std::vector<char>& balance) {
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      push(TokenType::name, src_.substr(pos_, e - pos_));
      pos_ = e;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    static const char* const two_char_ops[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : two_char_ops) {
      if (src_.compare(pos_, 2, op) == 0) {
        push(TokenType::op, op);
        pos_ += 2;
        return;
      }
    }
    static const std::string single_ops = "+-/*%~[](){}<>=.:|,;";
    if (single_ops.find(c) == std::string::npos) {
      error(std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty() || balance.back() != c) error(std::string("unexpected '") + c + "'");
      balance.pop_back();
    }
    push(TokenType::op, std::string(1, c));
    ++pos_;
  }

  std::string digits_with_underscores() {
    std::string digits;
    while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) ||
                                  (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                   std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))))) {
      if (src_[pos_] != '_') digits.push_back(src_[pos_]);
      ++pos_;
    }
    return digits;
  }

  void lex_number() {
    std::string text = digits_with_underscores();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      text += '.';
      text += digits_with_underscores();
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        text += src_.substr(pos_, p - pos_);
        pos_ = p;
        text += digits_with_underscores();
        is_float = true;
      }
    }
    Token t{is_float ? TokenType::floating : TokenType::integer, text, 0, 0.0, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      // Python ints are unbounded; a literal beyond int64 cannot be represented here.
      const auto res = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
      if (res.ec != std::errc() || res.ptr != text.data() + text.size()) error("integer literal too large");
    }
    tokens_.push_back(std::move(t));
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's "unicode-escape" decoding, which jinja2 applies to string literals.
  void lex_string(char quote) {
    const int start_line = line_;
    size_t p = pos_ + 1;
    std::string out;
    while (true) {
      if (p >= src_.size()) error("unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error("unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': ++line_; break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': case 'u': case 'U': {
          const int n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          char32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = p < src_.size() ? hex_value(src_[p]) : -1;
            if (h < 0) error(std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++p;
          }
          if (cp > 0x10FFFF) error("illegal Unicode character in string literal");
          append_code_point(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(src_[p++] - '0');
            }
            append_code_point(out, cp);
          } else if (e == 'N') {
            error("\\N{...} escapes are not supported in chat templates");
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    tokens_.push_back(Token{TokenType::string, std::move(out), 0, 0.0, start_line});
    pos_ = p + 1;
  }

  std::string src_;
  LexerOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(normalize_template_newlines(source), options).run();
}

}  // namespace fp8serve::jinja
