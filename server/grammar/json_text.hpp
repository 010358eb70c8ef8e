#pragma once
// The lexical pieces of JSON text as NFA fragments: sets of Unicode code points written as
// UTF-8 or as JSON escapes, whitespace, strings (optionally of bounded length or following a
// character-level automaton), and the literal text of a JSON value.
//
// Whitespace is bounded, as llama.cpp's JSON grammar bounds it: between tokens either nothing,
// one space, or a newline and up to kMaxIndent spaces or tabs. A weak model can otherwise pad
// whitespace until max_tokens.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/grammar/nfa.hpp"

namespace fp8serve::grammar {

inline constexpr char32_t kMaxCodepoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent closed intervals.
class CodepointSet {
 public:
  CodepointSet() = default;
  static CodepointSet range(char32_t lo, char32_t hi);
  static CodepointSet of(char32_t c) { return range(c, c); }
  static CodepointSet all();  // every scalar value (surrogates excluded)

  CodepointSet& add(char32_t lo, char32_t hi);
  CodepointSet& add(const CodepointSet& other);
  CodepointSet complement() const;  // within all()
  CodepointSet intersect(const CodepointSet& other) const;
  CodepointSet minus(const CodepointSet& other) const { return intersect(other.complement()); }
  bool contains(char32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<char32_t, char32_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<char32_t, char32_t>> ranges_;
};

// One character of the set as raw UTF-8 bytes (surrogates never).
Frag utf8_char(Nfa& nfa, const CodepointSet& set);

// One character of the set as it may appear inside a JSON string: raw where JSON allows it,
// escaped where it must be (\" \\ \n \t \r \b \f \u00XX). With `any_escapes` (the set is every
// character) the other escapes are allowed too: \/ and \uXXXX for any non-surrogate.
Frag json_string_char(Nfa& nfa, const CodepointSet& set, bool any_escapes);

// A character-level automaton (a compiled regular expression): edges read one character of
// a set, or nothing (set < 0).
struct CharNfa {
  struct Edge {
    int32_t from, to, set;
  };
  int32_t num_states = 0;
  int32_t start = 0, accept = 0;
  std::vector<CodepointSet> sets;
  std::vector<Edge> edges;
  int32_t add_state() { return num_states++; }
};

// The JSON string `"..."` whose unescaped contents the CharNfa accepts and whose length in
// characters is in [min_length, max_length] (max_length < 0: unbounded). An empty fragment
// (nothing) when no such string exists.
Frag json_string(Nfa& nfa, const CharNfa& chars, int64_t min_length, int64_t max_length);
// Any JSON string of length in [min_length, max_length].
Frag json_any_string(Nfa& nfa, int64_t min_length = 0, int64_t max_length = -1);

inline constexpr int kMaxIndent = 20;
Frag ws_break(Nfa& nfa);   // after { [ , and before } ]: nothing, a space, or newline + indent
Frag ws_inline(Nfa& nfa);  // around ':' and before ',': nothing or one space

// The compact JSON text of a value (enum and const members).
std::string json_literal_text(const nlohmann::ordered_json& value);

}  // namespace fp8serve::grammar
