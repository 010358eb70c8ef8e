#include "model/tokenizer/unicode_nfc.hpp"

#include <algorithm>
#include <vector>

#include "model/text/utf8.hpp"
#include "model/tokenizer/unicode_nfc_data.hpp"

namespace fp8serve {
namespace {

// Hangul syllables decompose and compose algorithmically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t cp) {
  using nfc_data::CombiningClass;
  const CombiningClass* begin = nfc_data::combining_classes;
  const CombiningClass* end = begin + nfc_data::combining_classes_size;
  const auto* it = std::lower_bound(begin, end, cp,
                                    [](const CombiningClass& e, char32_t v) { return e.cp < v; });
  return it != end && it->cp == cp ? it->ccc : 0;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  using nfc_data::Decomposition;
  const Decomposition* begin = nfc_data::decompositions;
  const Decomposition* end = begin + nfc_data::decompositions_size;
  const auto* it = std::lower_bound(begin, end, cp,
                                    [](const Decomposition& e, char32_t v) { return e.cp < v; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);  // full decomposition is recursive on the first element only
  if (it->second) decompose(it->second, out);
}

// Returns the primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  using nfc_data::Composition;
  const Composition* begin = nfc_data::compositions;
  const Composition* end = begin + nfc_data::compositions_size;
  const auto* it = std::lower_bound(begin, end, std::pair{a, b}, [](const Composition& e, auto v) {
    return e.first < v.first || (e.first == v.first && e.second < v.second);
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);  // ASCII is always NFC
  }
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  char32_t cp;
  std::size_t len;
  for (std::size_t pos = 0; pos < text.size(); pos += len) {
    decompose(utf8::decode(text, pos, cp, len) ? cp : U'\uFFFD', cps);
  }
  // Canonical ordering: stable sort every run of non-starters by combining class.
  for (std::size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless blocked by a character
  // of the same or higher class in between (or by any starter).
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;
  int last_class = -1;
  for (char32_t c : cps) {
    const int cc = combining_class(c);
    if (starter >= 0 && (last_class < cc || (last_class == 0 && out.size() == static_cast<std::size_t>(starter) + 1))) {
      if (char32_t composite = compose(out[static_cast<std::size_t>(starter)], c)) {
        out[static_cast<std::size_t>(starter)] = composite;
        continue;
      }
    }
    if (cc == 0) {
      starter = static_cast<std::ptrdiff_t>(out.size());
      last_class = 0;
    } else {
      last_class = cc;
    }
    out.push_back(c);
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) utf8::append(result, c);
  return result;
}

}  // namespace fp8serve
