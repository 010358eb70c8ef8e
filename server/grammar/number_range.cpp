#include "server/grammar/number_range.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

namespace fp8serve::grammar {

namespace {

// Non-negative integers as digit strings without leading zeros.
int compare(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

std::string increment(std::string a) {
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != '9') {
      ++a[i];
      return a;
    }
    a[i] = '0';
  }
  a.insert(a.begin(), '1');
  return a;
}

std::string decrement(std::string a) {  // PRECOND: a > 0
  for (size_t i = a.size(); i-- > 0;) {
    if (a[i] != '0') {
      --a[i];
      break;
    }
    a[i] = '9';
  }
  const size_t nz = a.find_first_not_of('0');
  return nz == std::string::npos ? "0" : a.substr(nz);
}

Frag digits(Nfa& nfa, int min, int max) {
  return nfa.repeat([&] { return nfa.byte_range('0', '9'); }, min, max);
}

// Digit strings of one length between a and b (same length, a <= b), leading zeros allowed.
Frag fixed_length_range(Nfa& nfa, const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return nfa.empty();
  const std::string a_rest = a.substr(1), b_rest = b.substr(1);
  if (a[0] == b[0]) return nfa.seq({nfa.literal(a.substr(0, 1)), fixed_length_range(nfa, a_rest, b_rest)});
  const bool a_rest_low = a_rest.find_first_not_of('0') == std::string::npos;
  const bool b_rest_high = b_rest.find_first_not_of('9') == std::string::npos;
  const auto rest = static_cast<int>(n - 1);
  if (a_rest_low && b_rest_high)
    return nfa.seq({nfa.byte_range(static_cast<uint8_t>(a[0]), static_cast<uint8_t>(b[0])), digits(nfa, rest, rest)});
  std::vector<Frag> alts;
  alts.push_back(nfa.seq({nfa.literal(a.substr(0, 1)), fixed_length_range(nfa, a_rest, std::string(n - 1, '9'))}));
  if (a[0] + 1 <= b[0] - 1)
    alts.push_back(nfa.seq({nfa.byte_range(static_cast<uint8_t>(a[0] + 1), static_cast<uint8_t>(b[0] - 1)), digits(nfa, rest, rest)}));
  alts.push_back(nfa.seq({nfa.literal(b.substr(0, 1)), fixed_length_range(nfa, std::string(n - 1, '0'), b_rest)}));
  return nfa.alt(alts);
}

// Integers in [lo, hi] written without leading zeros; hi unset: up to max_digits digits.
Frag uint_range(Nfa& nfa, const std::string& lo, const std::optional<std::string>& hi, int max_digits) {
  if (hi && compare(lo, *hi) > 0) return nfa.nothing();
  const size_t min_len = lo.size();
  const size_t max_len = hi ? hi->size() : std::max(static_cast<size_t>(max_digits), min_len);
  std::vector<Frag> alts;
  for (size_t len = min_len; len <= max_len; ++len) {
    std::string power(len, '0');  // 10^(len-1)
    power[0] = '1';
    const std::string a = len == min_len ? lo : power;
    const std::string b = hi && len == max_len ? *hi : std::string(len, '9');
    alts.push_back(fixed_length_range(nfa, a, b));
  }
  return nfa.alt(alts);
}

// Digits after the point, `.d1d2...` or nothing (the value 0.d1d2... with trailing zeros
// implied), such that the fraction is >= lo (> when lo_strict) and <= hi (< when hi_strict).
// An automaton over (position, still equal to lo's digits, still equal to hi's digits).
Frag fraction(Nfa& nfa, const std::string* lo, bool lo_strict, const std::string* hi, bool hi_strict, int max_digits) {
  Frag f{nfa.add_state(), nfa.add_state()};
  auto digit_at = [](const std::string* s, size_t p) { return p < s->size() ? (*s)[p] : '0'; };
  auto end_ok = [&](size_t p, bool tlo, bool thi) {
    // The rest is all zeros: compare with the rest of lo / hi (which have no trailing zeros).
    if (tlo && (p < lo->size() || lo_strict)) return false;
    if (thi && p >= hi->size() && hi_strict) return false;
    return true;
  };
  std::map<std::tuple<size_t, bool, bool>, int32_t> ids;
  std::vector<std::tuple<size_t, bool, bool>> work;
  auto node = [&](size_t p, bool tlo, bool thi) {
    auto [it, inserted] = ids.try_emplace({p, tlo, thi}, -1);
    if (inserted) {
      it->second = nfa.add_state();
      work.emplace_back(p, tlo, thi);
    }
    return it->second;
  };
  const bool tlo0 = lo != nullptr, thi0 = hi != nullptr;
  if (end_ok(0, tlo0, thi0)) nfa.add_epsilon(f.in, f.out);
  const int32_t after_point = nfa.add_state();
  nfa.add_bytes(f.in, '.', '.', after_point);
  nfa.add_epsilon(after_point, node(0, tlo0, thi0));
  while (!work.empty()) {
    const auto [p, tlo, thi] = work.back();
    work.pop_back();
    const int32_t s = ids.at({p, tlo, thi});
    if (p >= 1 && end_ok(p, tlo, thi)) nfa.add_epsilon(s, f.out);
    if (p >= static_cast<size_t>(max_digits)) continue;
    for (char d = '0'; d <= '9'; ++d) {
      if (tlo && d < digit_at(lo, p)) continue;
      if (thi && d > digit_at(hi, p)) continue;
      nfa.add_bytes(s, static_cast<uint8_t>(d), static_cast<uint8_t>(d),
                    node(p + 1, tlo && d == digit_at(lo, p), thi && d == digit_at(hi, p)));
    }
  }
  return f;
}

struct Magnitude {
  Decimal value;
  bool exclusive = false;
};

// Non-negative numbers without exponent in [lo, hi] (hi unset: unbounded).
Frag magnitude_range(Nfa& nfa, const Magnitude& lo, const std::optional<Magnitude>& hi) {
  const int frac_digits = static_cast<int>(std::max<size_t>(
      kMaxFractionDigits, std::max(lo.value.frac_part.size(), hi ? hi->value.frac_part.size() : 0) + 1));
  const std::string& a = lo.value.int_part;
  if (hi && compare(a, hi->value.int_part) > 0) return nfa.nothing();
  if (hi && a == hi->value.int_part)
    return nfa.seq({nfa.literal(a), fraction(nfa, &lo.value.frac_part, lo.exclusive, &hi->value.frac_part, hi->exclusive, frac_digits)});
  std::vector<Frag> alts;
  alts.push_back(nfa.seq({nfa.literal(a), fraction(nfa, &lo.value.frac_part, lo.exclusive, nullptr, false, frac_digits)}));
  const std::string mid_lo = increment(a);
  std::optional<std::string> mid_hi;
  if (hi) mid_hi = hi->value.int_part == "0" ? std::string() : decrement(hi->value.int_part);
  if (!mid_hi || (!mid_hi->empty() && compare(mid_lo, *mid_hi) <= 0)) {
    const int max_digits = std::max(kMaxIntegerDigits, static_cast<int>(a.size()) + 1);
    alts.push_back(nfa.seq({uint_range(nfa, mid_lo, mid_hi, max_digits), fraction(nfa, nullptr, false, nullptr, false, frac_digits)}));
  }
  if (hi)
    alts.push_back(nfa.seq({nfa.literal(hi->value.int_part),
                            fraction(nfa, nullptr, false, &hi->value.frac_part, hi->exclusive, frac_digits)}));
  return nfa.alt(alts);
}

// A signed integer: negative flag and magnitude.
struct Int {
  bool negative = false;
  std::string magnitude = "0";
};

// The smallest integer >= lo (> when exclusive).
Int ceil_bound(const NumberBound& b) {
  const Decimal& m = b.magnitude;
  if (!b.negative || m.is_zero()) {
    const bool bump = !m.frac_part.empty() || b.exclusive;
    return {false, bump ? increment(m.int_part) : m.int_part};
  }
  if (!m.frac_part.empty()) return {m.int_part != "0", m.int_part};  // -2.5 -> -2
  if (b.exclusive) {
    const std::string down = decrement(m.int_part);  // -3 exclusive -> -2
    return {down != "0", down};
  }
  return {true, m.int_part};
}

// The largest integer <= hi (< when exclusive).
Int floor_bound(const NumberBound& b) {
  const Decimal& m = b.magnitude;
  if (b.negative && !m.is_zero()) {
    const bool bump = !m.frac_part.empty() || b.exclusive;
    return {true, bump ? increment(m.int_part) : m.int_part};
  }
  if (!m.frac_part.empty()) return {false, m.int_part};  // 2.5 -> 2
  if (b.exclusive) {
    if (m.int_part == "0") return {true, "1"};
    return {false, decrement(m.int_part)};
  }
  return {false, m.int_part};
}

}  // namespace

NumberBound parse_bound(std::string_view text, bool exclusive, const std::string& keyword) {
  NumberBound b;
  b.present = true;
  b.exclusive = exclusive;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') {
    b.negative = true;
    ++i;
  }
  std::string mantissa;
  long exponent = 0;
  bool seen_point = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      mantissa += c;
      if (seen_point) --exponent;
    } else if (c == '.') {
      seen_point = true;
    } else if (c == 'e' || c == 'E') {
      const std::string e(text.substr(i + 1));
      if (e.size() > 6) throw GrammarError("'" + keyword + "' " + std::string(text) + " is too large or too precise", keyword);
      exponent += std::stol(e);
      break;
    } else {
      throw GrammarError("'" + keyword + "' must be a number", keyword);
    }
  }
  // value = mantissa * 10^exponent
  const size_t nz = mantissa.find_first_not_of('0');
  mantissa = nz == std::string::npos ? "" : mantissa.substr(nz);
  if (mantissa.empty()) {
    b.negative = false;
    return b;
  }
  const long int_digits = static_cast<long>(mantissa.size()) + exponent;
  if (int_digits > kMaxBoundDigits || -exponent > kMaxBoundDigits)
    throw GrammarError("'" + keyword + "' " + std::string(text) + " needs more than " + std::to_string(kMaxBoundDigits) +
                           " digits; use a bound of moderate size and precision",
                       keyword);
  std::string int_part, frac_part;
  if (int_digits <= 0) {
    frac_part = std::string(static_cast<size_t>(-int_digits), '0') + mantissa;
  } else if (int_digits >= static_cast<long>(mantissa.size())) {
    int_part = mantissa + std::string(static_cast<size_t>(int_digits) - mantissa.size(), '0');
  } else {
    int_part = mantissa.substr(0, static_cast<size_t>(int_digits));
    frac_part = mantissa.substr(static_cast<size_t>(int_digits));
  }
  while (!frac_part.empty() && frac_part.back() == '0') frac_part.pop_back();
  b.magnitude.int_part = int_part.empty() ? "0" : int_part;
  b.magnitude.frac_part = frac_part;
  return b;
}

Frag json_number(Nfa& nfa, const NumberBound& lo, const NumberBound& hi) {
  if (!lo.present && !hi.present) {
    Frag int_part = nfa.alt({nfa.literal("0"), nfa.seq({nfa.byte_range('1', '9'), digits(nfa, 0, kMaxIntegerDigits - 1)})});
    Frag frac = nfa.optional(nfa.seq({nfa.literal("."), digits(nfa, 1, kMaxFractionDigits)}));
    Frag exp = nfa.optional(nfa.seq({nfa.alt({nfa.literal("e"), nfa.literal("E")}),
                                     nfa.optional(nfa.alt({nfa.literal("+"), nfa.literal("-")})), digits(nfa, 1, kMaxExponentDigits)}));
    return nfa.seq({nfa.optional(nfa.literal("-")), int_part, frac, exp});
  }
  std::vector<Frag> alts;
  const bool hi_nonnegative = !hi.present || !hi.negative || hi.magnitude.is_zero();
  if (hi_nonnegative) {
    Magnitude from{};
    if (lo.present && (!lo.negative || lo.magnitude.is_zero())) from = {lo.magnitude, lo.exclusive};
    std::optional<Magnitude> to;
    if (hi.present) to = Magnitude{hi.magnitude, hi.exclusive};
    alts.push_back(magnitude_range(nfa, from, to));
  }
  const bool lo_negative = !lo.present || (lo.negative && !lo.magnitude.is_zero());
  if (lo_negative) {
    // -m with m in (0 or |hi|, |lo|]: the magnitude's bounds swap, and -0 is left to the
    // non-negative side.
    Magnitude from{Decimal{}, true};
    if (hi.present && hi.negative && !hi.magnitude.is_zero()) from = {hi.magnitude, hi.exclusive};
    std::optional<Magnitude> to;
    if (lo.present) to = Magnitude{lo.magnitude, lo.exclusive};
    alts.push_back(nfa.seq({nfa.literal("-"), magnitude_range(nfa, from, to)}));
  }
  return nfa.alt(alts);
}

Frag json_integer(Nfa& nfa, const NumberBound& lo, const NumberBound& hi) {
  std::optional<Int> low, high;
  if (lo.present) low = ceil_bound(lo);
  if (hi.present) high = floor_bound(hi);
  const int max_digits = std::max({kMaxIntegerDigits, low ? static_cast<int>(low->magnitude.size()) + 1 : 0,
                                   high ? static_cast<int>(high->magnitude.size()) + 1 : 0});
  std::vector<Frag> alts;
  if (!high || !high->negative) {
    const std::string from = low && !low->negative ? low->magnitude : "0";
    alts.push_back(uint_range(nfa, from, high ? std::optional<std::string>(high->magnitude) : std::nullopt, max_digits));
  }
  if (!low || low->negative) {
    const std::string from = high && high->negative ? high->magnitude : "1";
    const std::optional<std::string> to = low ? std::optional<std::string>(low->magnitude) : std::nullopt;
    alts.push_back(nfa.seq({nfa.literal("-"), uint_range(nfa, from, to, max_digits)}));
  }
  return nfa.alt(alts);
}

}  // namespace fp8serve::grammar
