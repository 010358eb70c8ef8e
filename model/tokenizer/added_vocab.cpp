#include "model/tokenizer/added_vocab.hpp"

#include <algorithm>

#include "model/text/utf8.hpp"

namespace fp8serve {

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

namespace {

// Code point ending at `end` (exclusive), or 0 at the start of the text / on invalid bytes.
char32_t code_point_before(std::string_view s, std::size_t end, std::size_t& len) {
  len = 0;
  for (std::size_t back = 1; back <= 4 && back <= end; ++back) {
    char32_t cp;
    std::size_t n;
    if ((static_cast<unsigned char>(s[end - back]) & 0xC0) != 0x80) {
      if (utf8::decode(s, end - back, cp, n) && n == back) {
        len = n;
        return cp;
      }
      return 0;
    }
  }
  return 0;
}

bool is_word_char(char32_t cp) {
  // Rust's char::is_alphanumeric() || '_'; outside ASCII anything but whitespace counts,
  // which errs on the side of not matching a single_word token inside a foreign word.
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  return !is_unicode_whitespace(cp);
}

}  // namespace

AddedVocab::AddedVocab(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::erase_if(tokens_, [](const AddedToken& t) { return t.content.empty(); });
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& [byte, list] : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

bool AddedVocab::word_boundary_ok(std::string_view text, std::size_t begin, std::size_t end) const {
  std::size_t len;
  const char32_t before = begin > 0 ? code_point_before(text, begin, len) : 0;
  char32_t after = 0;
  if (end < text.size() && !utf8::decode(text, end, after, len)) after = 0;
  return !(before && is_word_char(before)) && !(after && is_word_char(after));
}

std::vector<Fragment> AddedVocab::split(std::string_view text) const {
  std::vector<Fragment> out;
  std::size_t text_start = 0;  // start of the pending plain-text fragment
  std::size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* hit = nullptr;
    if (auto it = by_first_byte_.find(static_cast<unsigned char>(text[pos])); it != by_first_byte_.end()) {
      for (std::size_t i : it->second) {
        const AddedToken& t = tokens_[i];
        if (text.compare(pos, t.content.size(), t.content) == 0 &&
            (!t.single_word || word_boundary_ok(text, pos, pos + t.content.size()))) {
          hit = &t;
          break;  // longest first
        }
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    std::size_t begin = pos, end = pos + hit->content.size();
    if (hit->lstrip) {
      std::size_t len;
      while (begin > text_start) {
        const char32_t cp = code_point_before(text, begin, len);
        if (!len || !is_unicode_whitespace(cp)) break;
        begin -= len;
      }
    }
    if (hit->rstrip) {
      char32_t cp;
      std::size_t len;
      while (end < text.size() && utf8::decode(text, end, cp, len) && is_unicode_whitespace(cp)) end += len;
    }
    if (begin > text_start) out.push_back({text.substr(text_start, begin - text_start), -1});
    out.push_back({text.substr(begin, end - begin), hit->id});
    pos = text_start = end;
  }
  if (text_start < text.size()) out.push_back({text.substr(text_start), -1});
  return out;
}

}  // namespace fp8serve
