// Step outputs (engine.hpp): how the step's rows are sampled (on the host, or from the device's
// picks or candidates), every token handed on in plan order, speculative verification, and the
// proposals for the steps to come.
#include <algorithm>

#include "server/engine/engine.hpp"

namespace fp8serve {

void Engine::process_outputs(const StepPlan& plan, DeviceSampling on_device) {
  const auto vocab = static_cast<std::size_t>(model_config().vocab_size);
  // Sequences that sample alone from their row without a grammar (nearly all of them) are
  // sampled in parallel first, each from its own row of the step's logits (used as scratch);
  // forks and structured outputs then sample in turn, and every token is handed on in plan
  // order. Each sampler owns its RNG, so the draws do not depend on the threads or the batch.
  struct Pending {
    SeqId id;
    std::size_t row;
    bool parallel;
    SampleResult sample;
  };
  std::vector<Pending> pending;
  std::vector<Verify> verifying;
  std::size_t row = 0;
  std::vector<SeqId> scored_only;  // max_tokens 0: the prompt is scored, nothing sampled
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    if (!s.proposals.empty()) {
      verifying.push_back({s.id, row, &s.proposals});
      row += 1 + s.proposals.size();
      continue;
    }
    const auto it = seqs_.find(s.id);
    if (it != seqs_.end() && requests_.at(it->second.request_id).request.max_tokens == 0) {
      scored_only.push_back(s.id);
      scored_only.insert(scored_only.end(), s.forks.begin(), s.forks.end());
    } else {
      if (it != seqs_.end()) pending.push_back({s.id, row, s.forks.empty() && !it->second.matcher, {}});
      for (const SeqId child : s.forks) pending.push_back({child, row, false, {}});
    }
    ++row;
  }
  for (const SeqId id : scored_only) {
    RequestOutput out;
    attach_prompt_logprobs(seqs_.at(id), out);
    finish_seq(id, out, FinishReason::length);
  }
  std::vector<std::size_t> parallel;
  for (std::size_t i = 0; i < pending.size(); ++i)
    if (pending[i].parallel) parallel.push_back(i);
  std::vector<uint8_t> declined(pending.size(), 0);  // candidates that could not decide: sampled from the row below
  auto sample_row = [&](int64_t j) {
    const std::size_t i = parallel[static_cast<std::size_t>(j)];
    Pending& p = pending[i];
    Sampler& sampler = seqs_.at(p.id).sampler;
    if (on_device != DeviceSampling::none) {
      if (const std::optional<SampleResult> drawn = sample_on_device(on_device, sampler, p.row)) p.sample = *drawn;
      else declined[i] = 1;
    } else {
      p.sample = sampler.sample(std::span<float>(logits_.data() + p.row * vocab, vocab));
    }
  };
  if (device_.pool && parallel.size() > 1) {
    device_.pool->parallel_for(static_cast<int64_t>(parallel.size()), sample_row);
  } else {
    for (std::size_t j = 0; j < parallel.size(); ++j) sample_row(static_cast<int64_t>(j));
  }
  for (std::size_t i = 0; i < pending.size(); ++i) {  // the rare rows whose nucleus reaches past the candidates
    if (!declined[i]) continue;
    logits_.resize(vocab);
    transformer_->download_logits_row(static_cast<int64_t>(pending[i].row), logits_.span());
    pending[i].sample = seqs_.at(pending[i].id).sampler.sample_processed(logits_.span());  // processed on the device
  }

  for (Pending& p : pending) {
    const SeqId id = p.id;
    if (p.parallel) {
      on_token(id, p.sample);
      continue;
    }
    const auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    SeqState& seq = it->second;
    if (on_device != DeviceSampling::none) {  // structured output (no forks here: device_sampling)
      if (std::find(dead_ends_.begin(), dead_ends_.end(), id) != dead_ends_.end()) {
        fail_structured(id, kNoContinuation);
      } else if (const std::optional<SampleResult> sample =
                     sample_structured_on_device(id, seq, sample_on_device(on_device, seq.sampler, p.row), static_cast<int64_t>(p.row))) {
        on_token(id, *sample);
      }
      continue;
    }
    const std::span<const float> logits(logits_.data() + p.row * vocab, vocab);
    // Forks and structured outputs (which may sample twice) sample from a copy of the row.
    row_.assign(logits.begin(), logits.end());
    if (!seq.matcher) {
      on_token(id, seq.sampler.sample(row_));
    } else if (const std::optional<SampleResult> sample = sample_structured(id, seq, logits)) {
      on_token(id, *sample);
    }
  }
  for (const Verify& v : verifying) {
    verify(v, [&](SeqId id, SeqState& seq, std::size_t r) -> std::optional<SampleResult> {
      if (on_device != DeviceSampling::none) {  // no grammar, no processor here (device_sampling)
        if (std::optional<SampleResult> drawn = sample_on_device(on_device, seq.sampler, r)) return drawn;
        logits_.resize(vocab);
        transformer_->download_logits_row(static_cast<int64_t>(r), logits_.span());
        return seq.sampler.sample_processed(logits_.span());
      }
      const std::span<float> logits(logits_.data() + r * vocab, vocab);
      if (!seq.matcher) return seq.sampler.sample(logits);  // each row once: it may serve as scratch
      row_.assign(logits.begin(), logits.end());
      return sample_structured(id, seq, logits);  // the grammar masks the proposals' rows too
    });
  }
}

std::optional<SampleResult> Engine::sample_on_device(DeviceSampling sampling, Sampler& sampler, std::size_t row) {
  if (sampling == DeviceSampling::greedy) return sampler.accept_greedy(picks_[row]);
  const auto vocab = static_cast<int64_t>(model_config().vocab_size);
  const auto k = static_cast<std::size_t>(candidates_.rows[row].num_candidates);
  const auto at = row * static_cast<std::size_t>(candidates_.k);
  return sampler.sample_candidates(candidates_.rows[row], {candidates_.ids + at, k}, {candidates_.logits + at, k}, vocab);
}

void Engine::verify(const Verify& v, const VerifySampleFn& sample_row) {
  const std::vector<int32_t>& proposals = *v.proposals;
  int num_accepted = 0;
  for (std::size_t j = 0; j <= proposals.size(); ++j) {
    const auto it = seqs_.find(v.id);
    if (it == seqs_.end()) break;  // finished by the previous token (stop, length, grammar)
    const std::optional<SampleResult> sample = sample_row(v.id, it->second, v.row + j);
    if (!sample) break;
    const bool matches = j < proposals.size() && sample->token == proposals[j];
    on_token(v.id, *sample);
    if (!matches || !scheduler_->contains(v.id)) break;
    scheduler_->accept_proposed(v.id);
    ++num_accepted;
  }
  scheduler_->end_speculation(v.id);
  spec_counters_.record(static_cast<int>(proposals.size()), num_accepted);
  if (const auto it = seqs_.find(v.id); it != seqs_.end()) it->second.gate.record(it->second.num_generated, num_accepted);
}

void Engine::propose_drafts() {
  const std::vector<SeqId> ids = scheduler_->draft_candidates();
  if (ids.empty()) return;
  proposals_.resize(ids.size());
  std::vector<DraftJob> jobs;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    std::vector<int32_t>& out = proposals_[i];
    out.clear();
    const SeqState& seq = seqs_.at(ids[i]);
    if (!seq.gate.allows(seq.num_generated)) continue;
    // The step samples 1 + accepted tokens: no proposal past what the request may still generate.
    const auto max_tokens = static_cast<int>(std::min<int64_t>(options_.num_speculative_tokens, tokens_left(seq) - 1));
    const std::span<const int32_t> tokens = scheduler_->tokens(ids[i]);
    if (!draft_) ngram_propose(tokens, options_.ngram, max_tokens, out);
    else jobs.push_back({ids[i], tokens, max_tokens, &out, static_cast<int>(requests_.at(seq.request_id).request.prompt_tokens.size())});
  }
  if (draft_ && !jobs.empty()) draft_->propose(jobs);  // one batch: its decode passes run every sequence
  for (std::size_t i = 0; i < ids.size(); ++i) scheduler_->set_draft_tokens(ids[i], proposals_[i]);
}

Engine::DeviceSampling Engine::device_sampling(const StepPlan& plan) const {
  if (!device_sampling_ || !transformer_->samples_on_device()) return DeviceSampling::none;
  // Scoring prompt rows reruns the LM head into the same device logits: sample on the host then.
  if (!scorer_.rows().empty()) return DeviceSampling::none;
  // One sequence per row (no forks) and no grammar everywhere; then greedy if every token is its
  // row's argmax, else the prefilter. Logit processors and penalties run on the device first
  // (process_logits), for rows that ask no logprobs (those are of the raw row).
  // A step that verifies proposals samples its rows on the device only where no processor acts:
  // each verified row is sampled after the previous row's token joined the history, which the
  // step's one processing pass cannot see (and what acts on a verification's first row acts on
  // the rest: min_tokens bans only end, penalties act from the first generated token on).
  bool speculating = false;
  for (const ScheduledSeq& s : plan.seqs) speculating = speculating || !s.proposals.empty();
  bool greedy = true;
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    if (!s.forks.empty()) return DeviceSampling::none;
    const auto it = seqs_.find(s.id);
    if (it == seqs_.end()) continue;
    const Sampler& sampler = it->second.sampler;
    if (it->second.matcher) {
      // Structured output: the grammar's bitmask joins the row's processing on the device, so the
      // row's logprobs would be of the processed row: only rows that ask none (and no verification:
      // its rows' masks depend on the proposals before them).
      if (speculating || sampler.params().num_logprobs >= 0) return DeviceSampling::none;
      greedy = greedy && sampler.params().temperature <= 1e-5f;
      continue;
    }
    if (!sampler.candidates_on_device(kMaxSampleCandidates)) return DeviceSampling::none;
    if (speculating && !sampler.greedy_on_raw_logits() && !sampler.candidates_suffice(kMaxSampleCandidates))
      return DeviceSampling::none;
    greedy = greedy && sampler.greedy_on_device();
  }
  return greedy ? DeviceSampling::greedy : DeviceSampling::candidates;
}

}  // namespace fp8serve
