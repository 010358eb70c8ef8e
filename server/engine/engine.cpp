// The engine's step and its requests' lifecycle (engine.hpp): requests in (validated, queued),
// the step's stages, outputs and finishing, and the stats the metrics read.
#include "server/engine/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <stdexcept>

namespace fp8serve {

std::string Engine::validate(const GenerationRequest& r) const {
  const ModelConfig& c = model_config();
  if (requests_.count(r.request_id) != 0) return "duplicate request id '" + r.request_id + "'";
  if (r.prompt_tokens.empty()) return "the prompt is empty";
  for (const int32_t id : r.prompt_tokens)
    if (id < 0 || id >= c.vocab_size) return "prompt token id " + std::to_string(id) + " is outside the vocabulary";
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (id < 0 || id >= c.vocab_size) return "logit_bias token id " + std::to_string(id) + " is outside the vocabulary";
  for (const int32_t id : r.sampling.allowed_token_ids)
    if (id < 0 || id >= c.vocab_size) return "allowed_token_ids token id " + std::to_string(id) + " is outside the vocabulary";
  if (r.max_tokens < 0) return "max_tokens must be >= 0";
  if (r.sampling.min_tokens < 0 || r.sampling.min_tokens > r.max_tokens) return "min_tokens must be in [0, max_tokens]";
  if (r.n < 1 || r.n > options_.max_num_seqs)
    return "n must be in [1, " + std::to_string(options_.max_num_seqs) + "] (--max-num-seqs)";
  if (blocks_->window().enabled() && r.n > blocks_->num_tail_rings()) {
    return "n = " + std::to_string(r.n) + " needs a bf16 window ring per choice at once, and there are " +
           std::to_string(blocks_->num_tail_rings()) + " (raise --kv-bf16-window-share or --kv-cache-memory)";
  }
  const int64_t total = static_cast<int64_t>(r.prompt_tokens.size()) + r.max_tokens;
  if (total > options_.max_model_len) {
    return "prompt (" + std::to_string(r.prompt_tokens.size()) + " tokens) + max_tokens (" +
           std::to_string(r.max_tokens) + ") exceeds the maximum context length " +
           std::to_string(options_.max_model_len) + "; shorten the prompt or lower max_tokens";
  }
  const int64_t blocks_needed = (total + options_.block_size - 1) / options_.block_size;
  if (blocks_needed > blocks_->num_blocks()) {
    return "prompt + max_tokens needs " + std::to_string(blocks_needed) + " KV blocks but the pool has " +
           std::to_string(blocks_->num_blocks()) + "; raise --kv-cache-memory";
  }
  return {};
}

void Engine::reject(const GenerationRequest& request, const OutputSink& sink, const std::string& message) {
  for (int i = 0; i < std::max(1, request.n); ++i) {
    RequestOutput out;
    out.request_id = request.request_id;
    out.index = i;
    out.finish = FinishReason::error;
    out.error = message;
    out.prompt_tokens = static_cast<int>(request.prompt_tokens.size());
    sink(std::move(out));
  }
}

void Engine::add_request(GenerationRequest request, OutputSink sink) {
  if (std::string error = validate(request); !error.empty()) {
    reject(request, sink, error);
    return;
  }
  const std::string id = request.request_id;
  if (request.arrival == std::chrono::steady_clock::time_point{}) request.arrival = std::chrono::steady_clock::now();
  RequestState state;
  state.num_unfinished = request.n;
  if (request.num_prompt_logprobs >= 0) state.prompt_logprobs.resize(request.prompt_tokens.size() - 1);
  if (request.sampling.min_tokens > 0) {  // vLLM's MinTokensLogitsProcessor: EOS (unless ignored) and stop ids
    std::vector<int32_t>& banned = request.sampling.min_tokens_banned;
    if (!request.ignore_eos) banned = stop_ids_;
    banned.insert(banned.end(), request.stop_token_ids.begin(), request.stop_token_ids.end());
  }
  const uint64_t seed = request.sampling.seed.value_or(seed_rng_());
  for (int i = 0; i < request.n; ++i) {
    const SeqId seq_id = next_seq_id_++;
    state.seq_ids.push_back(seq_id);
    SamplingParams params = request.sampling;
    params.seed = seed + static_cast<uint64_t>(i);  // choices differ, and repeat with the seed
    auto [it, inserted] = seqs_.emplace(
        seq_id, SeqState{id, i, Sampler(params, request.prompt_tokens, seed),
                         IncrementalDetokenizer(*model_.tokenizer, request.skip_special_tokens),
                         StopChecker(request.stop, request.include_stop_str_in_output), 0});
    if (request.grammar) it->second.matcher = std::make_unique<grammar::GrammarMatcher>(request.grammar, !request.ignore_eos);
  }
  const std::vector<SeqId> forks(state.seq_ids.begin() + 1, state.seq_ids.end());
  // Prompt logprobs need logits at every prompt position: no prefix-cache hit for them.
  scheduler_->add(state.seq_ids.front(), request.prompt_tokens, forks, request.num_prompt_logprobs < 0, request.priority);
  state.request = std::move(request);
  state.sink = std::move(sink);
  requests_.emplace(id, std::move(state));
}

void Engine::abort(const std::string& request_id) {
  const auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  for (const SeqId id : std::vector<SeqId>(it->second.seq_ids)) {
    if (seqs_.count(id) == 0) continue;  // that choice already finished
    RequestOutput out;
    finish_seq(id, out, FinishReason::abort);
  }
}

void Engine::abort_all() {
  std::vector<std::string> ids;
  for (const auto& [id, request] : requests_) ids.push_back(id);
  for (const std::string& id : ids) abort(id);
}

// Finishes one choice: its blocks go back, the output carries the reason, and the request
// disappears with its last choice. `out` may already hold this step's token and text.
void Engine::finish_seq(SeqId id, RequestOutput& out, FinishReason reason) {
  SeqState& seq = seqs_.at(id);
  RequestState& request = requests_.at(seq.request_id);
  if (reason == FinishReason::length) {
    // Release what the stop checker held back; a character the sequence ended inside is dropped.
    seq.detokenizer.finish();
    out.text_delta += seq.stop_checker.flush();
  }
  out.request_id = seq.request_id;
  out.index = seq.index;
  out.finish = reason;
  out.prompt_tokens = static_cast<int>(request.request.prompt_tokens.size());
  out.completion_tokens = seq.num_generated;
  out.cached_tokens = scheduler_->contains(id) ? scheduler_->num_cached_tokens(id) : 0;
  out.queue_s = request.queue_s;
  if (draft_) draft_->release(id);
  scheduler_->finish(id);  // choices not forked yet are finished by the caller (abort loops all)
  const OutputSink sink = request.sink;
  seqs_.erase(id);
  --request.num_unfinished;
  const bool request_done = request.num_unfinished == 0;
  const std::string request_id = out.request_id;
  sink(std::move(out));
  if (request_done) requests_.erase(request_id);
}

void Engine::on_token(SeqId id, const SampleResult& sample) {
  SeqState& seq = seqs_.at(id);
  const RequestState& request = requests_.at(seq.request_id);
  const GenerationRequest& r = request.request;
  ++seq.num_generated;
  RequestOutput out;
  attach_prompt_logprobs(seq, out);
  out.new_tokens.push_back(sample.token);
  if (r.sampling.num_logprobs >= 0) out.logprobs.push_back(sample);

  // min_tokens: the sampler masked EOS and the stop ids until then; stop strings are looked for
  // once this token reaches it (vLLM's check_stop).
  const bool may_stop = seq.num_generated >= r.sampling.min_tokens;
  const bool is_eos = !r.ignore_eos && std::find(stop_ids_.begin(), stop_ids_.end(), sample.token) != stop_ids_.end();
  const bool is_stop_id = std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), sample.token) != r.stop_token_ids.end();
  if (may_stop && (is_eos || is_stop_id)) {
    // The stop token's own text is not emitted; what was held back before it is (but not a
    // character the sequence ended inside).
    seq.detokenizer.finish();
    out.text_delta = seq.stop_checker.flush();
    finish_seq(id, out, FinishReason::stop);
    return;
  }
  const StopChecker::Result text = seq.stop_checker.push(seq.detokenizer.push(sample.token), may_stop);
  out.text_delta = text.emit;
  if (text.stopped) {
    finish_seq(id, out, FinishReason::stop);
    return;
  }
  const int total = static_cast<int>(r.prompt_tokens.size()) + seq.num_generated;
  const bool out_of_budget = seq.num_generated >= r.max_tokens || total >= options_.max_model_len;
  if (seq.matcher && (seq.matcher->is_terminated() || (out_of_budget && seq.matcher->can_end()))) {
    // The structured output is complete, and nothing may follow it (or the budget is spent on
    // a complete document): end here, without waiting for an EOS the mask would force.
    seq.detokenizer.finish();  // a complete document ends on a whole character: nothing is held
    out.text_delta += seq.stop_checker.flush();
    finish_seq(id, out, FinishReason::stop);
    return;
  }
  if (out_of_budget) {
    finish_seq(id, out, FinishReason::length);
    return;
  }
  scheduler_->append_token(id, sample.token);
  out.request_id = seq.request_id;
  out.index = seq.index;
  out.prompt_tokens = static_cast<int>(r.prompt_tokens.size());
  out.completion_tokens = seq.num_generated;
  out.cached_tokens = scheduler_->num_cached_tokens(id);
  out.queue_s = request.queue_s;
  request.sink(std::move(out));
}

void Engine::attach_prompt_logprobs(SeqState& seq, RequestOutput& out) {
  if (seq.prompt_logprobs_sent) return;
  seq.prompt_logprobs_sent = true;
  const RequestState& request = requests_.at(seq.request_id);
  if (request.request.num_prompt_logprobs >= 0) out.prompt_logprobs = request.prompt_logprobs;
}

void Engine::step() {
  if (!scheduler_->has_work()) return;
  const StepPlan plan = scheduler_->schedule();
  if (plan.empty()) return;
  try {
    prepare_inputs(plan);
    const DeviceSampling sampling = run_forward(plan);
    commit_kv(plan);
    process_outputs(plan, sampling);
    propose_drafts();
  } catch (const std::exception& e) {
    // An engine bug or a device failure, not a client's doing (requests are validated on
    // entry): fail every request rather than continue on a state we no longer trust.
    spdlog::error("engine step failed: {}", e.what());
    fail_all(std::string("internal error: ") + e.what());
  }
}

// The forward batch: one row per scheduled sequence, except that a speculating one enters as
// 1 + proposals single-token rows, row j attending to the context up to its own token - each
// exactly the decode step of that token, whatever the kernels (with batch-invariant kernels,
// bitwise: docs/speculative-decoding.md).
void Engine::prepare_inputs(const StepPlan& plan) {
  const auto step_start = std::chrono::steady_clock::now();
  scorer_.clear();
  const bool window = blocks_->window().enabled();
  int32_t max_blocks = 1;
  for (const ScheduledSeq& s : plan.seqs)
    max_blocks = std::max(max_blocks, static_cast<int32_t>(blocks_->block_table(s.id).size()));
  batch_index_.clear();
  int32_t num_rows = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    batch_index_.push_back(num_rows);
    num_rows += s.proposals.empty() ? 1 : s.num_tokens;
  }
  inputs_->begin(num_rows, max_blocks);
  for (const ScheduledSeq& s : plan.seqs) {
    if (SeqState& seq = seqs_.at(s.id); !seq.scheduled) {
      seq.scheduled = true;
      RequestState& request = requests_.at(seq.request_id);
      if (request.queue_s < 0)
        request.queue_s = std::chrono::duration<double>(step_start - request.request.arrival).count();
    }
    add_score_rows(s, inputs_->num_tokens());
    // Where the FP8 part ends after this step: the same for every row of a speculating sequence
    // (its proposals never move the window's boundary: Scheduler::schedule_proposals).
    const int fp8_len = window ? blocks_->fp8_len_after(s.id, s.start + s.num_tokens, s.fp8_floor) : 0;
    const int rows = s.proposals.empty() ? 1 : s.num_tokens;
    // The chunk's tokens, or the decode's token and then its proposals, a row each.
    const std::size_t num_own = static_cast<std::size_t>(s.num_tokens) - s.proposals.size();
    const auto chunk = scheduler_->tokens(s.id).subspan(static_cast<std::size_t>(s.start), num_own);
    const std::span<const int32_t> proposals = s.proposals;
    for (int j = 0; j < rows; ++j) {
      const auto tokens = j == 0 ? chunk : proposals.subspan(static_cast<std::size_t>(j - 1), 1);
      // The first row spills what leaves the window; the others find nothing left to spill.
      const int spill_start = window ? (j == 0 ? blocks_->num_fp8_tokens(s.id) : fp8_len) : 0;
      inputs_->add(s.id, s.start + j, tokens, s.calibrate, fp8_len, spill_start);
    }
    if (s.samples) {  // a speculating sequence samples every row: its token's and each proposal's
      const int32_t last = inputs_->num_tokens() - 1;
      for (int32_t r = last - static_cast<int32_t>(s.proposals.size()); r <= last; ++r) inputs_->add_sample_row(r);
    }
  }
}

Engine::DeviceSampling Engine::run_forward(const StepPlan& plan) {
  const auto vocab = static_cast<std::size_t>(model_config().vocab_size);
  ForwardBatch batch = inputs_->batch();
  batch.score_rows = scorer_.rows();
  // No logits come back when the device samples the step (an empty span leaves them there).
  const DeviceSampling on_device = device_sampling(plan);
  logits_.resize(on_device != DeviceSampling::none ? 0 : batch.sample_rows.size() * vocab);

  transformer_->copy_blocks(plan.block_copies);
  std::fill(step_counts_.begin(), step_counts_.end(), KvWriteCounts{});
  transformer_->forward(batch, logits_.span(), step_counts_, [this](int64_t first, int64_t n, std::span<const float> logits) {
    scorer_.score(first, n, logits, device_.pool.get());
  });
  for (int layer = 0; layer < model_config().num_layers; ++layer)
    saturation_.add(layer, step_counts_[static_cast<std::size_t>(layer)]);
  if (on_device == DeviceSampling::none) return on_device;

  // Logit processors and penalties, where the logits are.
  processing_.clear(model_config().vocab_size);
  dead_ends_.clear();
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.samples) continue;
    const auto it = seqs_.find(s.id);
    if (it != seqs_.end() && it->second.matcher) {  // the grammar's mask, applied with the row's processing
      if (!fill_token_mask(it->second)) dead_ends_.push_back(s.id);
      processing_.add_row(&it->second.sampler, token_mask_);
      continue;
    }
    for (std::size_t r = 0; r <= s.proposals.size(); ++r)  // verified rows: nothing acts (device_sampling)
      processing_.add_row(it == seqs_.end() || r > 0 ? nullptr : &it->second.sampler);
  }
  if (processing_.any())
    transformer_->process_logits(processing_.mask_index, processing_.masks, processing_.edit_begin, processing_.edits);
  if (on_device == DeviceSampling::greedy) picks_ = transformer_->sample_greedy();
  if (on_device == DeviceSampling::candidates) {
    inv_temperature_.clear();
    raw_sum_wanted_.clear();
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.samples) continue;
      const auto it = seqs_.find(s.id);
      const float t = it == seqs_.end() ? 1.0f : it->second.sampler.params().temperature;
      inv_temperature_.insert(inv_temperature_.end(), 1 + s.proposals.size(), t > 1e-5f ? 1.0f / t : 1.0f);  // the host draw's 1/T
      // The raw row's sum serves logprobs only (Sampler::sample_candidates)
      const bool logprobs = it == seqs_.end() || it->second.sampler.params().num_logprobs >= 0;
      raw_sum_wanted_.insert(raw_sum_wanted_.end(), 1 + s.proposals.size(), logprobs ? 1 : 0);
    }
    candidates_ = transformer_->sample_candidates(inv_temperature_, raw_sum_wanted_);
  }
  return on_device;
}

void Engine::commit_kv(const StepPlan& plan) {
  // Calibrated scales go to the block manager before on_step_done freezes them.
  for (std::size_t i = 0; i < plan.seqs.size(); ++i)
    if (plan.seqs[i].calibrate) inputs_->write_back_scales(plan.seqs[i].id, batch_index_[i]);
  scheduler_->on_step_done(plan);
  if (blocks_->window().enabled()) {  // a fork owns a ring of its own: the parent's window, copied
    tail_copies_.clear();
    for (const ScheduledSeq& s : plan.seqs) {
      for (const SeqId child : s.forks)
        if (blocks_->tail_ring(child) >= 0) tail_copies_.push_back({blocks_->tail_ring(s.id), blocks_->tail_ring(child)});
    }
    transformer_->copy_tail_rings(tail_copies_);
  }
}

void Engine::add_score_rows(const ScheduledSeq& s, int32_t first_row) {
  SeqState& seq = seqs_.at(s.id);
  RequestState& request = requests_.at(seq.request_id);
  const GenerationRequest& r = request.request;
  if (r.num_prompt_logprobs < 0) return;
  // Positions whose next token is a prompt token and that no earlier step scored.
  const int begin = std::max(s.start, request.num_scored);
  const int end = std::min(s.start + s.num_tokens, static_cast<int>(r.prompt_tokens.size()) - 1);
  for (int p = begin; p < end; ++p) {
    scorer_.add(first_row + (p - s.start), {&request.prompt_logprobs, p, r.prompt_tokens[static_cast<std::size_t>(p + 1)],
                                            r.num_prompt_logprobs});
  }
  request.num_scored = std::max(request.num_scored, end);  // the forward pass below fills them
}

void Engine::fail_all(const std::string& message) {
  std::vector<SeqId> ids;
  for (const auto& [id, seq] : seqs_) ids.push_back(id);
  for (const SeqId id : ids) {
    RequestOutput out;
    out.error = message;
    finish_seq(id, out, FinishReason::error);
  }
}

EngineStats Engine::stats() const {
  EngineStats s;
  s.cache.block_size = blocks_->block_size();
  s.cache.num_blocks = blocks_->num_blocks();
  s.cache.cache_dtype = std::string(kv_dtype_name(options_.kv_dtype));
  s.cache.prefix_caching = options_.enable_prefix_caching;
  s.cache.bf16_window = transformer_->options().window.tokens;
  s.cache.rotation = std::string(kv_rotation_name(transformer_->options().kv_rotation));
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  const int total = blocks_->num_blocks();
  s.kv_usage = total > 0 ? static_cast<double>(total - blocks_->num_free_blocks()) / total : 0.0;
  if (const int rings = blocks_->num_tail_rings(); rings > 0) {
    s.kv_tail_usage = static_cast<double>(rings - blocks_->num_free_tail_rings()) / rings;
  }
  s.kv_ring_waits = scheduler_->num_ring_waits();
  s.num_preemptions = scheduler_->num_preemptions();
  if (options_.priority_scheduling) {
    for (const auto& [priority, c] : scheduler_->counts_by_priority())
      s.by_priority.push_back({priority, c.num_waiting, c.num_running, c.num_preemptions});
  }
  s.spec_num_drafts = spec_counters_.num_drafts;
  s.spec_num_draft_tokens = spec_counters_.num_draft_tokens;
  s.spec_num_accepted_tokens = spec_counters_.num_accepted_tokens;
  s.spec_accepted_per_pos = spec_counters_.accepted_per_pos;
  s.speculative = options_.num_speculative_tokens > 0;
  if (draft_) {
    const BlockManager& draft_blocks = draft_->block_manager();
    s.spec_draft_kv_usage = static_cast<double>(draft_blocks.num_blocks() - draft_blocks.num_free_blocks()) / draft_blocks.num_blocks();
  }
  const PrefixCacheStats prefix = blocks_->prefix_cache_stats();
  s.prefix_queries = prefix.num_queried_tokens;
  s.prefix_hits = prefix.num_hit_tokens;
  for (int layer = 0; layer < saturation_.num_layers(); ++layer) {
    const KvWriteCounts& c = saturation_.layer(layer);
    s.saturated_per_layer.push_back(c.num_k_saturated + c.num_v_saturated);
  }
  for (const auto& [id, seq] : seqs_) {
    if (!blocks_->contains(id)) continue;
    if (blocks_->window().enabled()) {
      s.kv_tail_tokens += static_cast<uint64_t>(blocks_->num_computed_tokens(id) - blocks_->num_fp8_tokens(id));
    }
    const KvScales& scales = blocks_->scales(id);
    if (!scales.frozen) continue;
    s.k_scales.insert(s.k_scales.end(), scales.k.begin(), scales.k.end());
    s.v_scales.insert(s.v_scales.end(), scales.v.begin(), scales.v.end());
  }
  return s;
}

}  // namespace fp8serve
