#include "server/grammar/regex.hpp"

#include "model/text/utf8.hpp"

#include <memory>
#include <string>
#include <vector>

namespace fp8serve::grammar {

namespace {

struct Node {
  enum class Kind { empty, set, concat, alt, repeat } kind = Kind::empty;
  CodepointSet set;
  std::vector<std::unique_ptr<Node>> children;
  int min = 0, max = 0;  // repeat; max < 0: unbounded
};
using NodePtr = std::unique_ptr<Node>;

CodepointSet digits() { return CodepointSet::range('0', '9'); }
CodepointSet word() { return CodepointSet::range('a', 'z').add('A', 'Z').add('0', '9').add('_', '_'); }
CodepointSet space() { return CodepointSet::of(' ').add('\t', '\r'); }  // \t \n \v \f \r
CodepointSet ascii() { return CodepointSet::range(0, 0x7F); }
CodepointSet any_but_newlines() {
  return CodepointSet::all().minus(CodepointSet::of('\n')).minus(CodepointSet::of('\r')).minus(CodepointSet::range(0x2028, 0x2029));
}

class Parser {
 public:
  Parser(std::string_view text, const RegexLimits& limits, const char* keyword)
      : limits_(limits), keyword_(keyword) {
    // The pattern came from a JSON string, so it is valid UTF-8 (an invalid byte would be U+FFFD).
    char32_t cp;
    size_t len;
    for (size_t i = 0; i < text.size(); i += len) cps_.push_back(utf8::decode(text, i, cp, len) ? cp : char32_t{0xFFFD});
  }

  NodePtr parse(bool& anchored_start, bool& anchored_end) {
    if (!cps_.empty() && cps_.front() == '^') {
      anchored_start = true;
      ++pos_;
    }
    if (cps_.size() > pos_ && cps_.back() == '$' && !escaped_at(cps_.size() - 1)) {
      anchored_end = true;
      cps_.pop_back();
    }
    NodePtr n = alternation();
    if (pos_ != cps_.size()) fail(cps_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError(std::string("'") + keyword_ + "': " + what + " at position " + std::to_string(pos_) +
                           " (supported: literals, . [] () (?:) | * + ? {n,m}, \\d \\w \\s and their negations, ^ and $ at the ends)",
                       keyword_);
  }
  bool escaped_at(size_t i) const {
    size_t backslashes = 0;
    while (i > backslashes && cps_[i - backslashes - 1] == '\\') ++backslashes;
    return backslashes % 2 == 1;
  }
  bool more() const { return pos_ < cps_.size(); }
  char32_t peek() const { return cps_[pos_]; }

  NodePtr alternation() {
    auto alt = std::make_unique<Node>();
    alt->kind = Node::Kind::alt;
    alt->children.push_back(concat());
    while (more() && peek() == '|') {
      ++pos_;
      alt->children.push_back(concat());
    }
    if (alt->children.size() == 1) return std::move(alt->children.front());
    return alt;
  }

  NodePtr concat() {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::Kind::concat;
    while (more() && peek() != '|' && peek() != ')') seq->children.push_back(quantified());
    return seq;
  }

  int number() {
    int n = 0;
    bool any = false;
    while (more() && peek() >= '0' && peek() <= '9') {
      n = n * 10 + static_cast<int>(peek() - '0');
      if (n > limits_.max_repeat) fail("a repetition bound above " + std::to_string(limits_.max_repeat));
      any = true;
      ++pos_;
    }
    if (!any) fail("a repetition bound expected");
    return n;
  }

  // {n}, {n,}, {n,m} when the text at pos_ is one; otherwise '{' is a literal (as ECMA allows).
  bool braces(int& min, int& max) {
    size_t p = pos_ + 1;
    if (p >= cps_.size() || cps_[p] < '0' || cps_[p] > '9') return false;
    ++pos_;
    min = number();
    max = min;
    if (more() && peek() == ',') {
      ++pos_;
      max = more() && peek() != '}' ? number() : -1;
    }
    if (!more() || peek() != '}') fail("'}' expected");
    ++pos_;
    if (max >= 0 && max < min) fail("a repetition {n,m} with m < n");
    return true;
  }

  NodePtr quantified() {
    NodePtr atom_node = atom();
    while (more()) {
      int min = 0, max = 0;
      const char32_t c = peek();
      if (c == '*') min = 0, max = -1, ++pos_;
      else if (c == '+') min = 1, max = -1, ++pos_;
      else if (c == '?') min = 0, max = 1, ++pos_;
      else if (c == '{' && braces(min, max)) {
      } else {
        break;
      }
      if (more() && peek() == '?') ++pos_;  // lazy: the same language
      auto rep = std::make_unique<Node>();
      rep->kind = Node::Kind::repeat;
      rep->min = min;
      rep->max = max;
      rep->children.push_back(std::move(atom_node));
      atom_node = std::move(rep);
    }
    return atom_node;
  }

  static NodePtr set_node(CodepointSet set) {
    auto n = std::make_unique<Node>();
    n->kind = Node::Kind::set;
    n->set = std::move(set);
    return n;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!more()) fail("a hexadecimal digit expected");
      const char32_t c = peek();
      int d = c >= '0' && c <= '9' ? static_cast<int>(c - '0') : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
                                    : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10) : -1;
      if (d < 0) fail("a hexadecimal digit expected");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash. `shorthand` tells the caller the set came from \d \w \s or a negation.
  CodepointSet escape(bool& shorthand) {
    if (!more()) fail("a pattern ending in a backslash");
    const char32_t c = peek();
    ++pos_;
    shorthand = true;
    switch (c) {
      case 'd': return digits();
      case 'D': return ascii().minus(digits());
      case 'w': return word();
      case 'W': return ascii().minus(word());
      case 's': return space();
      case 'S': return CodepointSet::range(0x21, 0x7E);
      default: break;
    }
    shorthand = false;
    switch (c) {
      case 't': return CodepointSet::of('\t');
      case 'n': return CodepointSet::of('\n');
      case 'r': return CodepointSet::of('\r');
      case 'f': return CodepointSet::of('\f');
      case 'v': return CodepointSet::of('\v');
      case 'x': return CodepointSet::of(hex(2));
      case 'u': return CodepointSet::of(hex(4));
      default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
      fail(std::string("the escape \\") + static_cast<char>(c) + " (backreferences, \\b and the like are not supported)");
    return CodepointSet::of(c);  // escaped punctuation stands for itself
  }

  NodePtr char_class() {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointSet set;
    bool has_shorthand = false;
    bool first = true;
    while (true) {
      if (!more()) fail("an unterminated character class");
      char32_t c = peek();
      if (c == ']' && !first) break;
      first = false;
      ++pos_;
      CodepointSet item;
      char32_t lo = c;
      bool single = true;
      if (c == '\\') {
        bool shorthand = false;
        item = escape(shorthand);
        has_shorthand |= shorthand;
        single = !shorthand && item.ranges().size() == 1 && item.ranges()[0].first == item.ranges()[0].second;
        if (single) lo = item.ranges()[0].first;
      } else {
        item = CodepointSet::of(c);
      }
      if (single && more() && peek() == '-' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        char32_t hi = peek();
        ++pos_;
        if (hi == '\\') {
          bool shorthand = false;
          const CodepointSet h = escape(shorthand);
          if (shorthand) fail("a class range ending in a shorthand class");
          hi = h.ranges()[0].first;
        }
        if (hi < lo) fail("a class range out of order");
        item = CodepointSet::range(lo, hi);
      }
      set.add(item);
    }
    ++pos_;  // ']'
    if (negate) {
      set = set.complement();
      if (has_shorthand) set = set.intersect(CodepointSet::range(0x20, 0x7E));
    }
    return set_node(std::move(set));
  }

  NodePtr atom() {
    const char32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (more() && peek() == '?') {
          if (pos_ + 1 < cps_.size() && cps_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            fail("a group modifier (lookaround, named groups and flags are not supported)");
          }
        }
        NodePtr inner = alternation();
        if (!more() || peek() != ')') fail("a missing ')'");
        ++pos_;
        return inner;
      }
      case '[': return char_class();
      case '.': return set_node(any_but_newlines());
      case '\\': {
        bool shorthand = false;
        return set_node(escape(shorthand));
      }
      case '^':
      case '$': fail("an anchor inside the pattern (only a leading ^ and a trailing $ are supported)");
      case '*':
      case '+':
      case '?': fail("a quantifier with nothing to repeat");
      default: return set_node(CodepointSet::of(c));
    }
  }

  const RegexLimits& limits_;
  const char* keyword_;
  std::vector<char32_t> cps_;
  size_t pos_ = 0;
};

class Emitter {
 public:
  Emitter(CharNfa& out, const RegexLimits& limits, const char* keyword) : out_(out), limits_(limits), keyword_(keyword) {}

  int32_t state() {
    if (out_.num_states >= limits_.max_char_states)
      throw GrammarError(std::string("'") + keyword_ + "' needs more than " + std::to_string(limits_.max_char_states) +
                             " automaton states (large repetition counts); simplify it",
                         keyword_);
    return out_.add_state();
  }
  int32_t set_index(const CodepointSet& set) {
    out_.sets.push_back(set);
    return static_cast<int32_t>(out_.sets.size()) - 1;
  }
  void edge(int32_t from, int32_t to, int32_t set) { out_.edges.push_back({from, to, set}); }

  std::pair<int32_t, int32_t> emit(const Node& n) {
    switch (n.kind) {
      case Node::Kind::empty: {
        const int32_t s = state();
        return {s, s};
      }
      case Node::Kind::set: {
        const int32_t a = state(), b = state();
        edge(a, b, set_index(n.set));
        return {a, b};
      }
      case Node::Kind::concat: {
        const int32_t a = state();
        int32_t last = a;
        for (const auto& child : n.children) {
          const auto [in, out] = emit(*child);
          edge(last, in, -1);
          last = out;
        }
        return {a, last};
      }
      case Node::Kind::alt: {
        const int32_t a = state(), b = state();
        for (const auto& child : n.children) {
          const auto [in, out] = emit(*child);
          edge(a, in, -1);
          edge(out, b, -1);
        }
        return {a, b};
      }
      case Node::Kind::repeat: {
        const int32_t a = state();
        int32_t last = a;
        for (int i = 0; i < n.min; ++i) {
          const auto [in, out] = emit(*n.children.front());
          edge(last, in, -1);
          last = out;
        }
        const int32_t end = state();
        if (n.max < 0) {
          const auto [in, out] = emit(*n.children.front());
          edge(last, in, -1);
          edge(out, last, -1);
          edge(last, end, -1);
        } else {
          for (int i = n.min; i < n.max; ++i) {
            edge(last, end, -1);
            const auto [in, out] = emit(*n.children.front());
            edge(last, in, -1);
            last = out;
          }
          edge(last, end, -1);
        }
        return {a, end};
      }
    }
    return {0, 0};
  }

 private:
  CharNfa& out_;
  const RegexLimits& limits_;
  const char* keyword_;
};

}  // namespace

CharNfa compile_regex(std::string_view pattern, const RegexLimits& limits, const char* keyword) {
  if (static_cast<int>(pattern.size()) > limits.max_pattern_bytes)
    throw GrammarError(std::string("'") + keyword + "' is longer than " + std::to_string(limits.max_pattern_bytes) + " bytes",
                       keyword);
  bool anchored_start = false, anchored_end = false;
  Parser parser(pattern, limits, keyword);
  NodePtr root = parser.parse(anchored_start, anchored_end);
  CharNfa nfa;
  Emitter emitter(nfa, limits, keyword);
  const int32_t start = emitter.state(), accept = emitter.state();
  const auto [in, out] = emitter.emit(*root);
  // Search semantics: anything (newlines too) may surround an unanchored pattern.
  const int32_t any = emitter.set_index(CodepointSet::all());
  if (anchored_start) {
    emitter.edge(start, in, -1);
  } else {
    emitter.edge(start, start, any);
    emitter.edge(start, in, -1);
  }
  if (anchored_end) {
    emitter.edge(out, accept, -1);
  } else {
    emitter.edge(out, accept, -1);
    emitter.edge(accept, accept, any);
  }
  nfa.start = start;
  nfa.accept = accept;
  return nfa;
}

std::string_view format_regex(std::string_view format) {
  static constexpr std::string_view kDate =
      "[1-9][0-9]{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))";
  static constexpr std::string_view kTime =
      "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string date = "^" + std::string(kDate) + "$";
  static const std::string time = "^" + std::string(kTime) + "$";
  static const std::string date_time = "^" + std::string(kDate) + "T" + std::string(kTime) + "$";
  static constexpr std::string_view kLabel = "[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?";
  static const std::string hostname = "^" + std::string(kLabel) + "(?:\\." + std::string(kLabel) + "){0,4}$";
  static const std::string uri =
      "^https?://" + std::string(kLabel) + "(?:\\." + std::string(kLabel) + "){0,4}(?:/[A-Za-z0-9._~-]{0,30}){0,6}$";
  if (format == "date") return date;
  if (format == "time") return time;
  if (format == "date-time") return date_time;
  if (format == "uuid") return "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";
  if (format == "email") return "^[A-Za-z0-9][A-Za-z0-9._%+-]{0,31}@[A-Za-z0-9][A-Za-z0-9-]{0,31}(?:\\.[A-Za-z0-9-]{1,32}){0,3}\\.[A-Za-z]{2,8}$";
  if (format == "ipv4")
    return "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])$";
  if (format == "hostname") return hostname;
  if (format == "uri") return uri;
  return {};
}

}  // namespace fp8serve::grammar
