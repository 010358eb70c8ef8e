#pragma once
// UTF-8 helpers shared by the tokenizers: decoding code points, and the "lossy" conversion that
// HF tokenizers applies to decoded bytes (each maximal invalid subpart becomes U+FFFD).
#include <cstddef>
#include <string>
#include <string_view>

namespace fp8serve::utf8 {

// Decodes one code point at s[pos]. On invalid input returns false and sets len to the length
// of the maximal invalid subpart (>= 1), as the Unicode "substitution of maximal subparts" rule.
bool decode(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len);

void append(std::string& out, char32_t cp);

bool is_valid(std::string_view s);

// Replaces every invalid subpart by U+FFFD (String::from_utf8_lossy).
std::string to_valid_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end inside an incomplete (but so far
// valid) multi-byte sequence: the part a streaming decoder may release now.
std::size_t complete_prefix_length(std::string_view bytes);

}  // namespace fp8serve::utf8
