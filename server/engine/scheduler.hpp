#pragma once
// Continuous batching (docs/design.md, "The scheduler"), nano-vllm style: pure host logic over the BlockManager,
// no model, no device, no HTTP. The engine loop calls, once per step:
//
//   plan = schedule()            which sequences run and how many tokens each
//   ... copy plan.block_copies, forward the batch, write calibrated scales ...
//   on_step_done(plan)           tokens now computed (scales freeze, forks happen)
//   append_token(id, token)      for every sequence that sampled, unless it finished:
//   finish(id)                   blocks back to the pool (or the prefix cache)
//   set_draft_tokens(id, tokens) speculative decoding: proposals for the next step's decode of
//                                each of draft_candidates(), made by the engine after the step
//
// Policy: running sequences decode first (one token each, oldest first); the leftover token
// budget (--max-num-batched-tokens) continues running prefills, then admits waiting sequences
// first-come-first-served (chunked prefill: a long prompt takes several steps). With the
// priority policy "oldest" and "first come" read "most urgent, then oldest" (priority, then
// arrival), and a waiting sequence that cannot be admitted first preempts less urgent ones. When the pool
// cannot hold a running sequence's next token, the newest running sequence is preempted: its
// blocks are freed and it goes back to the front of the queue, to be recomputed from its
// tokens (prompt + generated so far) with its frozen FP8 scales restored, so its KV is the same.
// With the bf16 window a sequence is admitted only with a tail ring for itself and each of its
// forks: the rings (a capped share of the KV budget) cap how many run at once, and no output
// depends on what else runs, as it would if a sequence admitted under load ran as pure FP8.
//
// With the bf16 window the KV of a token (past layer 0) depends on which of the earlier tokens
// its step read from FP8 - the window is per step, so a long prefill reads more of them from
// FP8 than the decode steps that computed the same tokens did. A recompute therefore replays
// the original steps' FP8 boundaries: each sequence keeps the list of (end, FP8 length) of its
// steps (consecutive steps with the same FP8 length merged: a decode run of up to a block), and
// the recompute goes chunk by chunk, each ending where an original step ended (or cut by the
// token budget) with that step's FP8 length as its floor, from a prefix hit no longer than the
// replay can use (every recomputed token's original step read the hit as FP8). So the
// recomputed KV is the original's up to the rounding of a prefill against a decode, as without
// a window; the price is a recompute in steps of about a block per decode run.
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_manager.hpp"
#include "cache/kv_scales.hpp"

namespace fp8serve {

struct SchedulerOptions {
  // Running sequences; a request's forks count at admission. A group larger than this is
  // admitted alone when nothing runs (the engine rejects n > max_num_seqs before that).
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;  // tokens per step
  // Speculative decoding (0: off): a decoding sequence may verify up to this many proposed tokens
  // after its last one, taking 1 + proposals of the step's budget.
  int num_speculative_tokens = 0;
  // No proposals in a step with more decoding sequences than this (the step is compute-bound:
  // verifying K more rows per sequence then costs about what it saves).
  int disable_by_batch_size = 2;
  // > 0: the backend's kernels compute a row as they would alone only in steps of at most this
  // many tokens (Backend::batch_invariant_tokens; CUDA's FP8 GEMV: 16). Proposals then go only
  // into steps without a prefill chunk, and only up to this many tokens in all, so that every
  // verified row is bitwise its own decode. 0: any step (the CPU).
  int max_speculative_step_tokens = 0;
  // --scheduling-policy priority: the queue and the running batch are ordered by (priority,
  // arrival), lower first; a waiting sequence that cannot be admitted preempts less urgent
  // running ones, least urgent and newest first. false: first come, first served.
  bool priority = false;
};

// One sequence's share of a step: tokens [start, start + num_tokens) of its token list.
struct ScheduledSeq {
  SeqId id = 0;
  int start = 0;
  int num_tokens = 0;
  bool samples = false;    // the chunk ends at the sequence's last token: sample from it
  bool calibrate = false;  // first prefill chunk: kv_write calibrates the FP8 scales
  int fp8_floor = 0;       // a recompute replaying a step: BlockManager::fp8_len_after's floor
  // Speculative decoding: tokens proposed after the decode's token (num_tokens = 1 + their
  // count). Every row samples; on_step_done counts the first token computed, accept_proposed()
  // each verified proposal, end_speculation() drops the rest.
  std::vector<int32_t> proposals;
  std::vector<SeqId> forks;  // created from this sequence by on_step_done (n > 1): they sample too
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;        // decodes first, then prefill chunks
  std::vector<BlockCopy> block_copies;   // copy-on-write, to run before the forward pass
  std::vector<SeqId> preempted;          // freed this step, back in the queue
  int num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // PRECOND: block_manager outlives the scheduler and nobody else allocates from it.
  Scheduler(const SchedulerOptions& options, BlockManager& block_manager);

  // Queues a sequence. fork_ids: extra sequences (n > 1 sampling) that share its prompt
  // blocks once its prefill is done. prefix_cache false: map no cached block, compute every
  // position (prompt logprobs need their logits). PRECOND: ids unused, prompt not empty.
  // priority: lower is more urgent (vLLM's); ignored unless options.priority.
  void add(SeqId id, std::span<const int32_t> prompt, std::span<const SeqId> fork_ids = {}, bool prefix_cache = true,
           int priority = 0);

  StepPlan schedule();
  void on_step_done(const StepPlan& plan);
  // The token sampled for a sequence that continues; its KV is computed by a later step.
  void append_token(SeqId id, int32_t token);

  // Speculative decoding, after a step for the next one (as vLLM v1's update_draft_token_ids):
  // the sequences whose next step decodes and may speculate, oldest first - none when more than
  // disable_by_batch_size decode (the step is compute-bound), or without speculation.
  std::vector<SeqId> draft_candidates() const;
  // Tokens proposed to follow `id`'s last token, verified in its next decode as far as the
  // budget, the pool and the bf16 window allow (schedule() cuts them); a later token or a
  // preemption makes them stale.
  void set_draft_tokens(SeqId id, std::span<const int32_t> tokens);
  // The token just appended equals the step's next proposal, whose KV the step computed: it
  // counts as computed (its full block may enter the prefix cache). PRECOND: it is a proposal
  // of this step, still held by the block manager.
  void accept_proposed(SeqId id);
  // After a speculating step's tokens are handed out: the unverified proposals leave the block
  // manager (their blocks return to the pool; their slots are rewritten by the tokens that
  // really come there). Unknown (finished) ids are ignored.
  void end_speculation(SeqId id);
  // Removes a sequence (finished or aborted) wherever it is; unknown ids are ignored (an abort
  // can race with the sequence's own finish). Pending forks of a waiting sequence go with it.
  void finish(SeqId id);

  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  uint64_t num_preemptions() const { return num_preemptions_; }
  // Per priority (0 alone under FCFS): sequences waiting and running now, preempted since start.
  struct PriorityCounts {
    int num_waiting = 0;
    int num_running = 0;
    uint64_t num_preemptions = 0;
  };
  std::map<int, PriorityCounts> counts_by_priority() const;
  // bf16 window: steps in which the next waiting sequence had its KV blocks but not the rings
  // for its group (every running sequence holds one: the rings cap the concurrency).
  uint64_t num_ring_waits() const { return num_ring_waits_; }
  bool contains(SeqId id) const { return seqs_.count(id) != 0; }
  std::span<const int32_t> tokens(SeqId id) const;  // prompt + generated (not the proposals)
  int num_cached_tokens(SeqId id) const;  // prompt tokens the prefix cache served at admission
  // BlockManager::check_integrity with the keys checked against the tokens, and every
  // sequence running here exactly when the block manager holds it (std::logic_error if not).
  void check_integrity() const;

 private:
  // One run of steps with the same FP8 length (bf16 window): tokens up to `end` were computed
  // by steps that read [0, fp8_len) from FP8.
  struct Fp8Step {
    int end = 0;
    int fp8_len = 0;
  };
  // waiting: queued (new, or preempted); prefilling: its prompt (or a recompute) is computed in
  // chunks; decoding: every token but the last is computed, and the next step computes that one.
  enum class Phase : uint8_t { waiting, prefilling, decoding };
  // The one record of a sequence's tokens and phase. Its KV - the block table, how many tokens
  // are computed (BlockManager::num_computed_tokens), the scales, the ring - is the block
  // manager's, which holds no copy of the tokens.
  struct Sequence {
    Phase phase = Phase::waiting;  // running: prefilling or decoding
    std::vector<int32_t> tokens;  // prompt + generated
    int num_prompt_tokens = 0;
    int num_cached_tokens = 0;
    bool prefix_cache = true;  // may map cached blocks at admission
    std::vector<SeqId> pending_forks;
    std::optional<KvScales> saved_scales;  // frozen scales kept across a preemption
    std::vector<Fp8Step> fp8_steps;        // bf16 window: what a recompute replays
    std::vector<int32_t> draft_tokens;     // speculative decoding: proposals after token draft_after - 1
    int draft_after = -1;
    std::vector<int32_t> verifying;  // the proposals this step verifies (their slots are held)
    int num_verified = 0;            // of those, accepted so far
    int priority = 0;                // lower first (the priority policy)
    uint64_t arrival = 0;            // add() order; forks share their parent's
  };

  Sequence& seq(SeqId id);
  void preempt(SeqId id, StepPlan& plan);
  bool before(SeqId a, SeqId b) const;  // (priority, arrival) order
  void enqueue_waiting(SeqId id, bool preempted);
  void add_running(SeqId id);
  void preempt_for_priority(StepPlan& plan);
  // What admitting a waiting sequence takes: seats for it and its forks (a group larger than
  // max_num_seqs runs alone), its prompt's blocks with a prefix hit capped so that a recompute
  // replays exactly, and with the bf16 window a ring for each of the group.
  struct Admission {
    int group = 1;
    bool seats = true;
    int max_cached = kNoCap;
    int need_rings = 0;
  };
  Admission admission(const Sequence& s) const;
  // Adds the stored proposals to the step's decodes, within the budget and the pool (never
  // preempting).
  void schedule_proposals(StepPlan& plan, int& budget);
  // Tokens [0, num_computed) now hold their KV: the block manager and the bf16 window's record.
  void mark_computed(SeqId id, Sequence& s, int num_computed, int fp8_floor);
  // The longest prefix hit a recompute of s can take (block-aligned, within what is cached).
  int replay_hit_limit(const Sequence& s) const;
  // The recorded step that computed token `position`, or null past the record.
  const Fp8Step* replayed_step(const Sequence& s, int position) const;

  SchedulerOptions options_;
  BlockManager& blocks_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::deque<SeqId> waiting_;
  std::vector<SeqId> running_;  // admission order: back() is the newest
  uint64_t num_preemptions_ = 0;
  uint64_t num_ring_waits_ = 0;
  uint64_t next_arrival_ = 0;
  std::map<int, uint64_t> preemptions_by_priority_;
};

}  // namespace fp8serve
