#include "server/engine/stop_checker.hpp"

#include <algorithm>

namespace fp8serve {

namespace {

// Length of the longest suffix of `text` that is a proper prefix of `stop`.
size_t partial_match(std::string_view text, std::string_view stop) {
  for (size_t n = std::min(text.size(), stop.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == stop.substr(0, n)) return n;
  return 0;
}

// Moves back to a UTF-8 character boundary, so held-back text never splits a character.
size_t char_boundary(std::string_view text, size_t pos) {
  while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

StopChecker::StopChecker(std::vector<std::string> stops, bool include_stop) : include_stop_(include_stop) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopChecker::Result StopChecker::push(std::string_view text, bool match) {
  Result result;
  if (stopped_) {
    result.stopped = true;
    return result;
  }
  pending_.append(text);
  if (!match) {
    result.emit.swap(pending_);
    return result;
  }
  // The earliest stop occurrence wins; among stops starting at the same place, the shortest.
  size_t first = std::string::npos;
  size_t length = 0;
  for (const auto& stop : stops_) {
    const size_t at = pending_.find(stop);
    if (at < first || (at == first && at != std::string::npos && stop.size() < length)) {
      first = at;
      length = stop.size();
    }
  }
  if (first != std::string::npos) {
    result.emit = pending_.substr(0, include_stop_ ? first + length : first);
    result.stopped = stopped_ = true;
    pending_.clear();
    return result;
  }
  size_t hold = 0;
  for (const auto& stop : stops_) hold = std::max(hold, partial_match(pending_, stop));
  const size_t cut = char_boundary(pending_, pending_.size() - hold);
  result.emit = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return result;
}

std::string StopChecker::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace fp8serve
