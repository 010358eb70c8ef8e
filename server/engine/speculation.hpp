#pragma once
// Speculative decoding's host logic (docs/speculative-decoding.md): the n-gram proposer (prompt
// lookup), the per-sequence rule that turns proposals off while they are rarely accepted, and
// the counters behind vLLM's spec_decode metrics. The scheduler places the proposals
// (Scheduler::schedule_proposals) and the engine verifies them (Engine::verify): one forward pass
// over the last token plus the proposals, every row sampled in turn exactly as a decode step
// would sample it, stopping at the first sampled token that differs from its proposal.
//
// Why that is the rejection rule: an n-gram proposal is deterministic, a draft distribution q
// that is one-hot on the proposed token d. The standard rule (Leviathan et al. 2023, Chen et al.
// 2023) accepts d with probability min(1, p(d) / q(d)) = p(d) and otherwise samples from
// norm(max(0, p - q)) = p without d. Sampling t ~ p and accepting iff t == d gives the same law:
// P(accept) = p(d), and on a mismatch t is p conditioned on t != d. So the verified output has
// the target's distribution; and since each row is sampled with the sequence's own RNG in the
// order plain decoding would, a seeded request gets the very tokens it gets without speculation.
#include <cstdint>
#include <span>
#include <vector>

namespace fp8serve {

struct NgramOptions {
  int min_n = 2;  // --prompt-lookup-min
  int max_n = 4;  // --prompt-lookup-max
};

// Prompt lookup: for n from max_n down to min_n, the most recent earlier occurrence of the last n
// tokens of `tokens`; proposes up to max_tokens of the tokens that followed it into `out`
// (cleared first). Nothing when no suffix of at least min_n tokens recurs.
void ngram_propose(std::span<const int32_t> tokens, const NgramOptions& options, int max_tokens,
                   std::vector<int32_t>& out);

// Per sequence: proposals pause while they are rarely accepted. Over the last kWindow drafts,
// fewer than kMinAcceptedPerDraft accepted tokens per draft pauses proposals for `backoff`
// generated tokens, the pause doubling each time (up to kMaxBackoff) and resetting once drafts
// pay again. A draft verifies K extra rows in the step; on the CPU the step costs about the same
// as a single-token decode (memory-bound) until K rows of compute show, so a draft that is
// rarely accepted costs little but not nothing (docs/speculative-decoding.md).
class AcceptanceGate {
 public:
  static constexpr int kWindow = 8;
  static constexpr double kMinAcceptedPerDraft = 0.5;
  static constexpr int kFirstBackoff = 16;
  static constexpr int kMaxBackoff = 512;

  bool allows(int num_generated) const { return num_generated >= paused_until_; }
  void record(int num_generated, int num_accepted);

 private:
  int drafts_ = 0;
  int accepted_ = 0;
  int paused_until_ = 0;
  int backoff_ = kFirstBackoff;
};

// vLLM's counters: drafts (steps that verified proposals), proposed and accepted tokens, and
// accepted tokens by position in the draft.
struct SpecDecodeCounters {
  uint64_t num_drafts = 0;
  uint64_t num_draft_tokens = 0;
  uint64_t num_accepted_tokens = 0;
  std::vector<uint64_t> accepted_per_pos;  // [K]

  void record(int num_proposed, int num_accepted);
};

}  // namespace fp8serve
