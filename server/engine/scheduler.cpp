#include "server/engine/scheduler.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace fp8serve {

Scheduler::Scheduler(const SchedulerOptions& options, BlockManager& block_manager)
    : options_(options), blocks_(block_manager) {
  if (options.max_num_seqs < 1 || options.max_num_batched_tokens < 1) {
    throw std::invalid_argument("Scheduler: max_num_seqs and max_num_batched_tokens must be >= 1");
  }
}

Scheduler::Sequence& Scheduler::seq(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::logic_error("Scheduler: unknown sequence " + std::to_string(id));
  return it->second;
}

void Scheduler::add(SeqId id, std::span<const int32_t> prompt, std::span<const SeqId> fork_ids, bool prefix_cache,
                    int priority) {
  if (prompt.empty()) throw std::logic_error("Scheduler::add: empty prompt");
  if (seqs_.count(id) != 0) throw std::logic_error("Scheduler::add: sequence id in use");
  for (const SeqId f : fork_ids)
    if (f == id || seqs_.count(f) != 0) throw std::logic_error("Scheduler::add: fork id in use");
  Sequence s;
  s.tokens.assign(prompt.begin(), prompt.end());
  s.num_prompt_tokens = static_cast<int>(prompt.size());
  s.phase = Phase::waiting;
  s.pending_forks.assign(fork_ids.begin(), fork_ids.end());
  s.prefix_cache = prefix_cache;
  s.num_cached_tokens = -1;  // not admitted yet
  s.priority = options_.priority ? priority : 0;
  s.arrival = next_arrival_++;
  seqs_.emplace(id, std::move(s));
  enqueue_waiting(id, /*preempted=*/false);
}

bool Scheduler::before(SeqId a, SeqId b) const {
  const Sequence& x = seqs_.at(a);
  const Sequence& y = seqs_.at(b);
  return x.priority != y.priority ? x.priority < y.priority : x.arrival < y.arrival;
}

// FCFS: a new sequence at the back, a preempted one at the front (it was running: it goes
// first). Priority: both by (priority, arrival), so the queue's front is the most urgent.
void Scheduler::enqueue_waiting(SeqId id, bool preempted) {
  if (!options_.priority) {
    preempted ? waiting_.push_front(id) : waiting_.push_back(id);
    return;
  }
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), id, [this](SeqId a, SeqId b) { return before(a, b); }), id);
}

// FCFS: admission order. Priority: by (priority, arrival), so that the decode pass serves the
// most urgent first and the back - the preemption victim - is the least urgent, newest.
void Scheduler::add_running(SeqId id) {
  if (!options_.priority) {
    running_.push_back(id);
    return;
  }
  running_.insert(std::upper_bound(running_.begin(), running_.end(), id, [this](SeqId a, SeqId b) { return before(a, b); }), id);
}

void Scheduler::preempt(SeqId id, StepPlan& plan) {
  Sequence& s = seq(id);
  const KvScales& scales = blocks_.scales(id);
  // Recomputing must reproduce the same KV: keep the scales the first prefill froze.
  if (scales.frozen) s.saved_scales = scales;
  blocks_.free(id);
  s.phase = Phase::waiting;
  s.verifying.clear();
  s.num_verified = 0;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  enqueue_waiting(id, /*preempted=*/true);
  plan.preempted.push_back(id);
  ++num_preemptions_;
  ++preemptions_by_priority_[s.priority];
}

// Priority policy: while the most urgent waiting sequence cannot be admitted (no seat, or not
// the blocks or rings for its prompt) and a less urgent one runs, the least urgent, newest
// running sequence is preempted - before the step schedules anything, so no victim is in the
// plan. The admission pass then admits it if the step's decodes leave the room.
void Scheduler::preempt_for_priority(StepPlan& plan) {
  while (!waiting_.empty() && !running_.empty()) {
    const Sequence& head = seqs_.at(waiting_.front());
    const SeqId victim = running_.back();
    if (seqs_.at(victim).priority <= head.priority) return;
    const Admission a = admission(head);
    if (a.seats && blocks_.can_allocate(head.tokens, a.max_cached, a.need_rings)) return;
    preempt(victim, plan);
  }
}

// With the bf16 window every sequence runs with a ring of its own, its forks too: what a token
// reads from bf16 never depends on what else runs (the rings cap the concurrency).
Scheduler::Admission Scheduler::admission(const Sequence& s) const {
  Admission a;
  a.group = 1 + static_cast<int>(s.pending_forks.size());
  a.seats = running_.empty() || static_cast<int>(running_.size()) + a.group <= options_.max_num_seqs;
  a.max_cached = !s.prefix_cache ? 0 : s.fp8_steps.empty() ? kNoCap : replay_hit_limit(s);
  a.need_rings = blocks_.window().enabled() ? a.group : 0;
  return a;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int budget = options_.max_num_batched_tokens;
  std::vector<SeqId> decoded;  // scheduled in the decode pass
  if (options_.priority) preempt_for_priority(plan);
  bool pool_short = false;  // a decode had to preempt
  int short_class = std::numeric_limits<int>::max();  // the most urgent priority it preempted

  // 1. Decodes, oldest first: each needs a slot for the token it sampled last step.
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const SeqId id = running_[i];
    Sequence& s = seq(id);
    if (s.phase != Phase::decoding) continue;
    if (static_cast<int>(s.tokens.size()) != blocks_.num_tokens(id) + 1)
      throw std::logic_error("Scheduler: decoding sequence " + std::to_string(id) + " has no new token to compute");
    bool preempted_self = false;
    while (!blocks_.can_append(id)) {
      const SeqId victim = running_.back();  // the newest (least urgent); never one scheduled already
      short_class = std::min(short_class, seq(victim).priority);
      preempt(victim, plan);
      pool_short = true;
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) break;  // it was the newest: nobody after it is left
    const AppendResult slot = blocks_.append_slot(id);
    if (slot.spill_copy) plan.block_copies.push_back(*slot.spill_copy);
    if (slot.copy) plan.block_copies.push_back(*slot.copy);
    ScheduledSeq step;
    step.id = id;
    step.start = static_cast<int>(s.tokens.size()) - 1;
    step.num_tokens = 1;
    step.samples = true;
    plan.seqs.push_back(std::move(step));
    decoded.push_back(id);
    --budget;
  }

  auto schedule_chunk = [&](SeqId id, Sequence& s, bool calibrate) {
    const int computed = blocks_.num_computed_tokens(id);
    const int remaining = static_cast<int>(s.tokens.size()) - computed;
    int chunk = std::min(remaining, budget);
    ScheduledSeq step;
    if (const Fp8Step* replayed = replayed_step(s, computed)) {
      // A recompute: end where the original step ended, read what it read from FP8.
      chunk = std::min(chunk, replayed->end - computed);
      step.fp8_floor = replayed->fp8_len;
    }
    step.id = id;
    step.start = computed;
    step.num_tokens = chunk;
    step.samples = chunk == remaining;
    step.calibrate = calibrate;
    if (step.samples) step.forks = s.pending_forks;
    budget -= chunk;
    plan.seqs.push_back(std::move(step));
  };

  const bool speculate = options_.num_speculative_tokens > 0;
  if (speculate && options_.max_speculative_step_tokens == 0) schedule_proposals(plan, budget);
  const std::size_t num_decodes = plan.seqs.size();

  // The priority policy gives the step's prefill tokens to the most urgent class that has a
  // prompt to compute (running, or first in the queue): a step that prefills an urgent sequence
  // carries no less urgent chunk, and those wait while it is admitted.
  int prefill_class = std::numeric_limits<int>::max();
  if (options_.priority) {
    for (const SeqId id : running_)
      if (const Sequence& s = seq(id); s.phase == Phase::prefilling) prefill_class = std::min(prefill_class, s.priority);
    if (!waiting_.empty()) prefill_class = std::min(prefill_class, seq(waiting_.front()).priority);
  }

  // 2. Running prefills continue (chunked prefill).
  for (const SeqId id : running_) {
    if (budget <= 0) break;
    Sequence& s = seq(id);
    if (std::find(decoded.begin(), decoded.end(), id) != decoded.end()) continue;
    if (s.phase == Phase::prefilling && s.priority <= prefill_class) schedule_chunk(id, s, false);
  }

  // 3. Admit waiting sequences, first come first served. Not in a step that had to preempt:
  // the pool is short, and the preempted sequence would only be admitted to be preempted again
  // - unless (priority) it is more urgent than all it preempted: they, not it, would go next.
  while (!waiting_.empty() && budget > 0) {
    const SeqId id = waiting_.front();
    Sequence& s = seq(id);
    if (s.priority > prefill_class) break;
    if (pool_short && !(options_.priority && s.priority < short_class)) break;
    const Admission a = admission(s);
    if (!a.seats) break;
    if (!blocks_.can_allocate(s.tokens, a.max_cached, a.need_rings)) {
      if (a.need_rings > 0 && blocks_.can_allocate(s.tokens, a.max_cached, 0)) ++num_ring_waits_;
      break;
    }
    const AllocateResult allocated = blocks_.allocate(id, s.tokens, a.max_cached, a.group);
    if (s.num_cached_tokens < 0) s.num_cached_tokens = allocated.num_cached_tokens;
    if (blocks_.window().enabled() && s.fp8_steps.empty() && allocated.num_cached_tokens > 0) {
      // A first admission with a hit: those tokens were FP8 from the start.
      s.fp8_steps.push_back({allocated.num_cached_tokens, allocated.num_cached_tokens});
    }
    bool calibrate = false;
    if (KvScales* scales = blocks_.scales_to_calibrate(id)) {
      if (s.saved_scales) {
        scales->k = s.saved_scales->k;
        scales->v = s.saved_scales->v;
      } else {
        calibrate = true;
      }
    }
    s.saved_scales.reset();
    s.phase = Phase::prefilling;
    waiting_.pop_front();
    add_running(id);
    schedule_chunk(id, s, calibrate);
  }

  // A backend whose kernels are batch invariant only in small steps: proposals after the
  // prefills, in a step that has none (a new request's prefill is not held back by guesses).
  if (speculate && options_.max_speculative_step_tokens > 0 && plan.seqs.size() == num_decodes)
    schedule_proposals(plan, budget);
  for (const ScheduledSeq& step : plan.seqs) plan.num_tokens += step.num_tokens;
  return plan;
}

// Proposals come after every decode has its slot, so they never take a block that a decode
// needs, and never preempt. A sequence's proposals are cut where the pool, the budget or the
// bf16 window would stop them: with a window, every verified row must read the FP8 part that
// its own single-token decode step would read (the window's boundary moves a block at a time),
// so that the verified logits are the plain decode's bit for bit.
void Scheduler::schedule_proposals(StepPlan& plan, int& budget) {
  if (plan.seqs.empty() || static_cast<int>(plan.seqs.size()) > options_.disable_by_batch_size) return;
  if (!plan.preempted.empty()) return;  // the pool is short, or a preemption made room for a more urgent sequence
  // Each sequence's cap in plan order, the budget shared out among them.
  int left = budget;
  if (options_.max_speculative_step_tokens > 0)  // every scheduled sequence is a decode here: one token each
    left = std::min(left, options_.max_speculative_step_tokens - static_cast<int>(plan.seqs.size()));
  for (ScheduledSeq& step : plan.seqs) {
    if (left <= 0) break;
    Sequence& s = seq(step.id);
    const int n = static_cast<int>(s.tokens.size());
    int max_tokens = std::min(options_.num_speculative_tokens, left);
    if (blocks_.window().enabled()) {
      while (max_tokens > 0 && blocks_.fp8_len_after(step.id, n + max_tokens) != blocks_.fp8_len_after(step.id, n))
        --max_tokens;
    }
    if (max_tokens <= 0) continue;
    left -= max_tokens;
    if (s.draft_after != n) continue;  // none proposed for this decode
    for (std::size_t i = 0; i < s.draft_tokens.size() && static_cast<int>(i) < max_tokens; ++i) {
      if (!blocks_.can_append(step.id)) break;
      const AppendResult slot = blocks_.append_slot(step.id);
      if (slot.spill_copy) plan.block_copies.push_back(*slot.spill_copy);
      if (slot.copy) plan.block_copies.push_back(*slot.copy);
      step.proposals.push_back(s.draft_tokens[i]);
    }
    s.verifying = step.proposals;
    s.num_verified = 0;
    s.draft_tokens.clear();
    s.draft_after = -1;
    step.num_tokens += static_cast<int>(step.proposals.size());
    budget -= static_cast<int>(step.proposals.size());
  }
}

std::vector<SeqId> Scheduler::draft_candidates() const {
  std::vector<SeqId> ids;
  if (options_.num_speculative_tokens <= 0) return ids;
  for (const SeqId id : running_)
    if (seqs_.at(id).phase == Phase::decoding) ids.push_back(id);
  if (static_cast<int>(ids.size()) > options_.disable_by_batch_size) ids.clear();
  return ids;
}

void Scheduler::set_draft_tokens(SeqId id, std::span<const int32_t> tokens) {
  Sequence& s = seq(id);
  s.draft_tokens.assign(tokens.begin(), tokens.end());
  s.draft_after = static_cast<int>(s.tokens.size());
}

void Scheduler::mark_computed(SeqId id, Sequence& s, int num_computed, int fp8_floor) {
  blocks_.mark_computed(id, s.tokens, num_computed, fp8_floor);
  if (blocks_.window().enabled() && (s.fp8_steps.empty() || num_computed > s.fp8_steps.back().end)) {
    const int fp8_len = blocks_.num_fp8_tokens(id);  // a new step, not a replayed one
    if (!s.fp8_steps.empty() && s.fp8_steps.back().fp8_len == fp8_len) s.fp8_steps.back().end = num_computed;
    else s.fp8_steps.push_back({num_computed, fp8_len});
  }
}

void Scheduler::accept_proposed(SeqId id) {
  Sequence& s = seq(id);
  const int position = blocks_.num_computed_tokens(id);
  // The step's proposals follow the decode's token; those before this one are verified.
  const auto i = static_cast<std::size_t>(s.num_verified);
  if (static_cast<int>(s.tokens.size()) != position + 1 || i >= s.verifying.size() || s.verifying[i] != s.tokens.back()) {
    throw std::logic_error("Scheduler::accept_proposed: sequence " + std::to_string(id) +
                           " has no computed proposal equal to its last token");
  }
  mark_computed(id, s, position + 1, 0);
  ++s.num_verified;
}

void Scheduler::end_speculation(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end() || it->second.phase == Phase::waiting) return;
  it->second.verifying.clear();
  it->second.num_verified = 0;
  blocks_.truncate(id, blocks_.num_computed_tokens(id));
}

void Scheduler::on_step_done(const StepPlan& plan) {
  for (const ScheduledSeq& step : plan.seqs) {
    Sequence& s = seq(step.id);
    // A speculating step counts its first token; the proposals count as they are verified.
    const int computed = step.start + step.num_tokens - static_cast<int>(step.proposals.size());
    mark_computed(step.id, s, computed, step.fp8_floor);
    if (step.samples) s.phase = Phase::decoding;  // its next token is sampled now
    for (const SeqId child : step.forks) {
      blocks_.fork(step.id, child);
      Sequence c;
      c.tokens = s.tokens;
      c.num_prompt_tokens = s.num_prompt_tokens;
      c.num_cached_tokens = s.num_cached_tokens;
      c.fp8_steps = s.fp8_steps;
      c.phase = Phase::decoding;
      c.priority = s.priority;
      c.arrival = s.arrival;
      seqs_.emplace(child, std::move(c));
      add_running(child);
    }
    if (!step.forks.empty()) s.pending_forks.clear();
  }
}

void Scheduler::append_token(SeqId id, int32_t token) {
  Sequence& s = seq(id);
  if (s.phase == Phase::waiting || static_cast<int>(s.tokens.size()) != blocks_.num_computed_tokens(id)) {
    throw std::logic_error("Scheduler::append_token: sequence " + std::to_string(id) +
                           " has tokens whose KV is not computed yet");
  }
  s.tokens.push_back(token);
}

void Scheduler::finish(SeqId id) {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  if (it->second.phase != Phase::waiting) {
    blocks_.free(id);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  seqs_.erase(it);
}

const Scheduler::Fp8Step* Scheduler::replayed_step(const Sequence& s, int position) const {
  for (const Fp8Step& step : s.fp8_steps)
    if (position < step.end) return &step;
  return nullptr;
}

// A hit of h tokens is exact for the replay when every recomputed token's original step read
// at least h tokens from FP8: its FP8 length is non-decreasing, so when the step that computed
// token h did (past the record: the decode step that would have come next). The largest such h
// (block-aligned) that the cache holds now.
int Scheduler::replay_hit_limit(const Sequence& s) const {
  const int block = blocks_.block_size();
  const int next_fp8_len = std::max(s.fp8_steps.back().fp8_len, blocks_.window().fp8_len(static_cast<int>(s.tokens.size())));
  const int cached = std::min(blocks_.num_cached_prefix_tokens(s.tokens), s.fp8_steps.back().end);
  for (int h = cached / block * block; h > 0; h -= block) {
    const Fp8Step* step = replayed_step(s, h);
    if ((step != nullptr ? step->fp8_len : next_fp8_len) >= h) return h;
  }
  return 0;
}

void Scheduler::check_integrity() const {
  blocks_.check_integrity([this](SeqId id) { return tokens(id); });
  for (const auto& [id, s] : seqs_) {
    const bool running = std::find(running_.begin(), running_.end(), id) != running_.end();
    if (running != (s.phase != Phase::waiting) || running != blocks_.contains(id))
      throw std::logic_error("Scheduler: sequence " + std::to_string(id) + " is running in one place and not in another");
  }
}

std::map<int, Scheduler::PriorityCounts> Scheduler::counts_by_priority() const {
  std::map<int, PriorityCounts> counts;
  for (const auto& [id, s] : seqs_) {
    PriorityCounts& c = counts[s.priority];
    (s.phase == Phase::waiting ? c.num_waiting : c.num_running) += 1;
  }
  for (const auto& [priority, n] : preemptions_by_priority_) counts[priority].num_preemptions = n;
  return counts;
}

std::span<const int32_t> Scheduler::tokens(SeqId id) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::logic_error("Scheduler: unknown sequence " + std::to_string(id));
  return it->second.tokens;
}

int Scheduler::num_cached_tokens(SeqId id) const {
  const auto it = seqs_.find(id);
  if (it == seqs_.end()) throw std::logic_error("Scheduler: unknown sequence " + std::to_string(id));
  return std::max(0, it->second.num_cached_tokens);
}

}  // namespace fp8serve
