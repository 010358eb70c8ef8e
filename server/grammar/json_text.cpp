#include "server/grammar/json_text.hpp"

#include <algorithm>
#include <map>

namespace fp8serve::grammar {

namespace {

constexpr char32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// Encodes c as UTF-8 in exactly n bytes (n chosen by the caller from c's range).
void encode(char32_t c, int n, uint8_t* out) {
  if (n == 1) {
    out[0] = static_cast<uint8_t>(c);
    return;
  }
  static constexpr uint8_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    c >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | c);
}

using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// [lo, hi] all of one encoded length n -> byte-range sequences. Splits the interval until each
// continuation position spans either one value or the whole 80-BF range below a fixed prefix,
// so that the byte ranges position by position describe exactly the interval.
void split_same_length(char32_t lo, char32_t hi, int n, std::vector<ByteSeq>& out) {
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, n, out);
        split_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, n, out);
        split_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode(lo, n, a);
  encode(hi, n, b);
  ByteSeq seq;
  for (int k = 0; k < n; ++k) seq.emplace_back(a[k], b[k]);
  out.push_back(std::move(seq));
}

bool is_all(const CodepointSet& set) { return set.ranges() == CodepointSet::all().ranges(); }

}  // namespace

CodepointSet CodepointSet::range(char32_t lo, char32_t hi) {
  CodepointSet s;
  s.add(lo, hi);
  return s;
}

CodepointSet CodepointSet::all() {
  CodepointSet s;
  s.add(0, kSurrogateLo - 1);
  s.add(kSurrogateHi + 1, kMaxCodepoint);
  return s;
}

CodepointSet& CodepointSet::add(char32_t lo, char32_t hi) {
  if (lo > hi) return *this;
  hi = std::min(hi, kMaxCodepoint);
  std::vector<std::pair<char32_t, char32_t>> out;
  bool placed = false;
  for (const auto& [a, b] : ranges_) {
    if (b + 1 < lo) {
      out.emplace_back(a, b);
    } else if (hi + 1 < a) {
      if (!placed) out.emplace_back(lo, hi), placed = true;
      out.emplace_back(a, b);
    } else {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
  }
  if (!placed) out.emplace_back(lo, hi);
  std::sort(out.begin(), out.end());
  ranges_ = std::move(out);
  return *this;
}

CodepointSet& CodepointSet::add(const CodepointSet& other) {
  for (const auto& [a, b] : other.ranges_) add(a, b);
  return *this;
}

CodepointSet CodepointSet::complement() const {
  CodepointSet out;
  char32_t next = 0;
  for (const auto& [a, b] : ranges_) {
    if (a > next) out.add(next, a - 1);
    next = b + 1;
  }
  if (next <= kMaxCodepoint) out.add(next, kMaxCodepoint);
  return out.intersect(all());
}

CodepointSet CodepointSet::intersect(const CodepointSet& other) const {
  CodepointSet out;
  for (const auto& [a, b] : ranges_)
    for (const auto& [c, d] : other.ranges_) {
      const char32_t lo = std::max(a, c), hi = std::min(b, d);
      if (lo <= hi) out.add(lo, hi);
    }
  return out;
}

bool CodepointSet::contains(char32_t c) const {
  for (const auto& [a, b] : ranges_)
    if (c >= a && c <= b) return true;
  return false;
}

Frag utf8_char(Nfa& nfa, const CodepointSet& set) {
  static constexpr char32_t kLengthEnd[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodepoint};
  std::vector<ByteSeq> seqs;
  const CodepointSet valid = set.intersect(CodepointSet::all());
  for (const auto& [a, b] : valid.ranges()) {
    char32_t lo = a;
    for (int n = 1; n <= 4 && lo <= b; ++n) {
      if (lo > kLengthEnd[n - 1]) continue;
      const char32_t hi = std::min(b, kLengthEnd[n - 1]);
      split_same_length(lo, hi, n, seqs);
      lo = hi + 1;
    }
  }
  // Sequences share their tails of whole continuation bytes (80-BF): tail[k] reads k of them,
  // so the automaton stays small (and its DFA too, without a minimization pass).
  Frag f{nfa.add_state(), nfa.add_state()};
  std::vector<int32_t> tail{f.out};
  auto tail_state = [&](size_t k) {
    while (tail.size() <= k) {
      const int32_t s = nfa.add_state();
      nfa.add_bytes(s, 0x80, 0xBF, tail.back());
      tail.push_back(s);
    }
    return tail[k];
  };
  for (const ByteSeq& seq : seqs) {
    size_t j = seq.size();
    while (j > 1 && seq[j - 1] == std::pair<uint8_t, uint8_t>{0x80, 0xBF}) --j;
    int32_t cur = f.in;
    for (size_t k = 0; k < j; ++k) {
      const int32_t next = k + 1 == j ? tail_state(seq.size() - j) : nfa.add_state();
      nfa.add_bytes(cur, seq[k].first, seq[k].second, next);
      cur = next;
    }
  }
  return f;
}

Frag json_string_char(Nfa& nfa, const CodepointSet& set, bool any_escapes) {
  std::vector<Frag> alts;
  CodepointSet raw = set.intersect(CodepointSet::range(0x20, kMaxCodepoint));
  raw = raw.minus(CodepointSet::of('"')).minus(CodepointSet::of('\\'));
  if (!raw.empty()) alts.push_back(utf8_char(nfa, raw));

  // After a backslash: one state, edges straight to the end for the short escapes.
  Frag esc{nfa.add_state(), nfa.add_state()};
  const int32_t after = nfa.add_state();
  nfa.add_bytes(esc.in, '\\', '\\', after);
  bool any = false;
  static constexpr std::pair<char32_t, char> kShort[] = {{'"', '"'}, {'\\', '\\'}, {0x08, 'b'}, {0x0C, 'f'},
                                                         {0x0A, 'n'}, {0x0D, 'r'}, {0x09, 't'}};
  for (const auto& [c, letter] : kShort)
    if (set.contains(c)) {
      nfa.add_bytes(after, static_cast<uint8_t>(letter), static_cast<uint8_t>(letter), esc.out);
      any = true;
    }
  if (any_escapes) {
    nfa.add_bytes(after, '/', '/', esc.out);
    // \uXXXX outside the surrogates D800-DFFF: [0-9a-ce-f]XXX or d[0-7]XX, with shared tails.
    const int32_t u = nfa.add_state(), h3 = nfa.add_state(), h2 = nfa.add_state(), h1 = nfa.add_state(), d = nfa.add_state();
    nfa.add_bytes(after, 'u', 'u', u);
    for (const auto& [lo, hi] : {std::pair{'0', '9'}, std::pair{'a', 'c'}, std::pair{'A', 'C'}, std::pair{'e', 'f'}, std::pair{'E', 'F'}})
      nfa.add_bytes(u, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), h3);
    nfa.add_bytes(u, 'd', 'd', d);
    nfa.add_bytes(u, 'D', 'D', d);
    nfa.add_bytes(d, '0', '7', h2);
    const std::pair<int32_t, int32_t> hex_steps[] = {{h3, h2}, {h2, h1}, {h1, esc.out}};
    for (const auto& [from, to] : hex_steps)
      for (const auto& [lo, hi] : {std::pair{'0', '9'}, std::pair{'a', 'f'}, std::pair{'A', 'F'}})
        nfa.add_bytes(from, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to);
    any = true;
  } else {
    for (char32_t c = 0; c < 0x20; ++c) {
      if (!set.contains(c) || c == 0x08 || c == 0x0C || c == 0x0A || c == 0x0D || c == 0x09) continue;
      static constexpr char kHex[] = "0123456789abcdef";
      const Frag lit = nfa.literal(std::string("u00") + kHex[c >> 4] + kHex[c & 15]);
      nfa.add_epsilon(after, lit.in);
      nfa.add_epsilon(lit.out, esc.out);
      any = true;
    }
  }
  if (any) alts.push_back(esc);
  return nfa.alt(alts);
}

Frag json_string(Nfa& nfa, const CharNfa& chars, int64_t min_length, int64_t max_length) {
  if (max_length >= 0 && min_length > max_length) return nfa.nothing();
  // States (character-automaton state, characters so far); without an upper bound the count
  // saturates at min_length, so the product stays finite.
  const int64_t cap = max_length >= 0 ? max_length : min_length;
  std::vector<std::vector<const CharNfa::Edge*>> out_edges(static_cast<size_t>(chars.num_states));
  for (const CharNfa::Edge& e : chars.edges) out_edges[static_cast<size_t>(e.from)].push_back(&e);
  std::vector<uint8_t> set_is_all;
  for (const CodepointSet& s : chars.sets) set_is_all.push_back(is_all(s) ? 1 : 0);

  Frag f{nfa.add_state(), nfa.add_state()};
  const int32_t close = nfa.add_state();
  nfa.add_bytes(close, '"', '"', f.out);
  std::map<std::pair<int32_t, int64_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int64_t>> work;
  auto state = [&](int32_t q, int64_t count) {
    auto [it, inserted] = ids.try_emplace({q, count}, -1);
    if (inserted) {
      it->second = nfa.add_state();
      work.emplace_back(q, count);
    }
    return it->second;
  };
  nfa.add_bytes(f.in, '"', '"', state(chars.start, 0));
  while (!work.empty()) {
    const auto [q, count] = work.back();
    work.pop_back();
    const int32_t s = ids.at({q, count});
    if (q == chars.accept && count >= min_length) nfa.add_epsilon(s, close);
    for (const CharNfa::Edge* e : out_edges[static_cast<size_t>(q)]) {
      if (e->set < 0) {
        nfa.add_epsilon(s, state(e->to, count));
        continue;
      }
      int64_t next = count + 1;
      if (max_length >= 0 && next > max_length) continue;
      next = std::min(next, cap);
      const Frag ch = json_string_char(nfa, chars.sets[static_cast<size_t>(e->set)], set_is_all[static_cast<size_t>(e->set)]);
      nfa.add_epsilon(s, ch.in);
      nfa.add_epsilon(ch.out, state(e->to, next));
    }
  }
  return f;
}

Frag json_any_string(Nfa& nfa, int64_t min_length, int64_t max_length) {
  CharNfa any;
  any.start = any.accept = any.add_state();
  any.sets.push_back(CodepointSet::all());
  any.edges.push_back({0, 0, 0});
  return json_string(nfa, any, min_length, max_length);
}

Frag ws_break(Nfa& nfa) {
  Frag indent = nfa.repeat([&] { return nfa.alt({nfa.literal(" "), nfa.literal("\t")}); }, 0, kMaxIndent);
  return nfa.optional(nfa.alt({nfa.literal(" "), nfa.seq({nfa.literal("\n"), indent})}));
}

Frag ws_inline(Nfa& nfa) { return nfa.optional(nfa.literal(" ")); }

std::string json_literal_text(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace fp8serve::grammar
