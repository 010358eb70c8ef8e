#pragma once
// JSON numbers as NFA fragments: unbounded numbers and integers (digit counts bounded, so a
// model cannot write digits forever), and numbers or integers within JSON Schema's
// minimum / maximum / exclusiveMinimum / exclusiveMaximum, exactly, for bounds written as
// decimals. Bounded numbers are written without an exponent.
#include <string>
#include <string_view>

#include "server/grammar/nfa.hpp"

namespace fp8serve::grammar {

inline constexpr int kMaxIntegerDigits = 16;   // unbounded integer parts
inline constexpr int kMaxFractionDigits = 16;  // digits after the point
inline constexpr int kMaxExponentDigits = 3;
inline constexpr int kMaxBoundDigits = 40;     // digits of a schema bound, before or after the point

// A non-negative decimal: int_part without leading zeros ("0" for zero), frac_part without
// trailing zeros.
struct Decimal {
  std::string int_part = "0";
  std::string frac_part;
  bool is_zero() const { return int_part == "0" && frac_part.empty(); }
};

struct NumberBound {
  bool present = false;
  bool negative = false;
  Decimal magnitude;
  bool exclusive = false;
};

// JSON number text ("-1.5e3") -> sign and magnitude. Throws GrammarError (naming `keyword`)
// when the value needs more than kMaxBoundDigits digits on either side of the point.
NumberBound parse_bound(std::string_view text, bool exclusive, const std::string& keyword);

Frag json_number(Nfa& nfa, const NumberBound& lo, const NumberBound& hi);
Frag json_integer(Nfa& nfa, const NumberBound& lo, const NumberBound& hi);

}  // namespace fp8serve::grammar
