#include "model/text/utf8.hpp"

namespace fp8serve::utf8 {

namespace {

bool decode_sequence(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len,
                     bool pass_surrogates) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    cp = b0;
    len = 1;
    return true;
  }
  std::size_t need;
  char32_t value;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (rejects overlongs, surrogates)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    value = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED && !pass_surrogates) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    value = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    len = 1;
    return false;
  }
  for (std::size_t i = 1; i <= need; ++i) {
    if (pos + i >= s.size()) {
      len = i;
      return false;
    }
    const unsigned char b = byte(pos + i);
    const unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      len = i;
      return false;
    }
    value = (value << 6) | (b & 0x3F);
  }
  cp = value;
  len = need + 1;
  return true;
}

}  // namespace

bool decode(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len) {
  return decode_sequence(s, pos, cp, len, false);
}

bool decode_surrogatepass(std::string_view s, std::size_t pos, char32_t& cp, std::size_t& len) {
  return decode_sequence(s, pos, cp, len, true);
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid(std::string_view s) {
  char32_t cp;
  std::size_t len;
  for (std::size_t pos = 0; pos < s.size(); pos += len) {
    if (!decode(s, pos, cp, len)) return false;
  }
  return true;
}

std::string to_valid_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  char32_t cp;
  std::size_t len;
  for (std::size_t pos = 0; pos < bytes.size(); pos += len) {
    if (decode(bytes, pos, cp, len)) {
      out.append(bytes.substr(pos, len));
    } else {
      out += "\xEF\xBF\xBD";
    }
  }
  return out;
}

std::size_t incomplete_tail_length(std::string_view bytes) {
  // A character is at most 4 bytes, so an incomplete one starts within the last 3.
  for (std::size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const std::size_t pos = bytes.size() - back;
    if ((static_cast<unsigned char>(bytes[pos]) & 0xC0) == 0x80) continue;  // a continuation byte
    const auto lead = static_cast<unsigned char>(bytes[pos]);
    char32_t cp;
    std::size_t len;
    // From a valid lead byte, decode() fails at the end of the input exactly when it runs out
    // of bytes; an invalid continuation byte fails it earlier.
    return lead >= 0xC2 && lead <= 0xF4 && !decode(bytes, pos, cp, len) && pos + len == bytes.size() ? back : 0;
  }
  return 0;
}

}  // namespace fp8serve::utf8
