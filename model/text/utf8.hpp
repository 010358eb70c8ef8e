#pragma once
// The UTF-8 codec (the tokenizers, the chat templates and the grammar engine share it): decoding
// code points, and the "lossy" conversion that HF tokenizers applies to decoded bytes (each
// maximal invalid subpart becomes U+FFFD).
#include <cstddef>
#include <string>
#include <string_view>

namespace fp8serve::utf8 {

// Decodes one code point at s[pos]. On invalid input returns false and sets len to the length
// of the maximal invalid subpart (>= 1), as the Unicode "substitution of maximal subparts" rule.
bool decode(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len);

// As decode, but an encoded surrogate (ED A0..BF 80..BF) decodes to its code point U+D800..U+DFFF,
// as Python's "surrogatepass" error handler does: a Python str may hold a lone surrogate, and
// append() writes it back as these bytes.
bool decode_surrogatepass(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len);

void append(std::string& out, char32_t cp);

bool is_valid(std::string_view s);

// Replaces every invalid subpart by U+FFFD (String::from_utf8_lossy).
std::string to_valid_lossy(std::string_view bytes);

// Length of the incomplete character `bytes` ends with: a valid lead byte and the valid
// continuation bytes that follow it, fewer than the lead byte announces (0 when there is none).
// Everything before it a streaming decoder may release now; invalid bytes included, since no
// later byte can make them valid.
std::size_t incomplete_tail_length(std::string_view bytes);

}  // namespace fp8serve::utf8
