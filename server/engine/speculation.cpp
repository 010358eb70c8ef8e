#include "server/engine/speculation.hpp"

#include <algorithm>

namespace fp8serve {

void ngram_propose(std::span<const int32_t> tokens, const NgramOptions& options, int max_tokens,
                   std::vector<int32_t>& out) {
  out.clear();
  const auto size = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int n = std::min<int64_t>(options.max_n, size - 1); n >= options.min_n; --n) {
    const std::span<const int32_t> suffix = tokens.subspan(static_cast<std::size_t>(size - n));
    // The most recent earlier match: start at size - n - 1 (a match that overlaps the suffix
    // itself is fine; it proposes the tokens that followed it, at least one of which exists).
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_tokens, size - from);
      out.assign(tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

void AcceptanceGate::record(int num_generated, int num_accepted) {
  ++drafts_;
  accepted_ += num_accepted;
  if (drafts_ < kWindow) return;
  if (static_cast<double>(accepted_) < kMinAcceptedPerDraft * drafts_) {
    paused_until_ = num_generated + backoff_;
    backoff_ = std::min(2 * backoff_, kMaxBackoff);
  } else {
    backoff_ = kFirstBackoff;
  }
  drafts_ = 0;
  accepted_ = 0;
}

void SpecDecodeCounters::record(int num_proposed, int num_accepted) {
  ++num_drafts;
  num_draft_tokens += static_cast<uint64_t>(num_proposed);
  num_accepted_tokens += static_cast<uint64_t>(num_accepted);
  if (accepted_per_pos.size() < static_cast<std::size_t>(num_proposed)) accepted_per_pos.resize(static_cast<std::size_t>(num_proposed), 0);
  for (int i = 0; i < num_accepted; ++i) ++accepted_per_pos[static_cast<std::size_t>(i)];
}

}  // namespace fp8serve
