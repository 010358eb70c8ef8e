#include "server/engine.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

#include "kernels/cpu/cpu_backend.hpp"

namespace fp8serve {

namespace {
constexpr const char* kNoContinuation = "structured output: no token can continue the text the schema requires";
}  // namespace

EngineOptions engine_options_from_config(const Config& config) {
  EngineOptions options;
  options.device = config.device;
  options.gpu_memory_utilization = config.gpu_memory_utilization;
  options.kv_dtype = config.kv_cache_dtype;
  options.kv_scale_margin = static_cast<float>(config.kv_scale_margin);
  options.quantize_fp8 = config.quantization == Quantization::fp8;
  options.quantize_lm_head = config.fp8_lm_head;
  // A bf16 pool is exact already: the window applies to FP8 KV alone (the start-up log says so).
  options.kv_bf16_window = options.kv_dtype == KvDtype::fp8_e4m3 ? config.kv_bf16_window : 0;
  options.kv_bf16_window_values = config.kv_bf16_window_tensors == KvWindowTensors::kv;
  options.max_tail_share = config.kv_bf16_window_share;
  options.block_size = config.block_size;
  if (config.kv_cache_memory > 0) options.kv_cache_memory = static_cast<uint64_t>(config.kv_cache_memory);
  options.max_model_len = config.max_model_len;
  options.max_num_seqs = config.max_num_seqs;
  options.max_num_batched_tokens = config.max_num_batched_tokens;
  options.enable_prefix_caching = config.enable_prefix_caching;
  options.threads = config.threads;
  options.enforce_eager = config.enforce_eager;
  options.lazy_graph_capture = config.lazy_graph_capture;
  if (config.speculative_method != SpeculativeMethod::none) options.num_speculative_tokens = config.num_speculative_tokens;
  if (config.speculative_method == SpeculativeMethod::draft) options.speculative_model = config.speculative_model;
  options.ngram = NgramOptions{config.prompt_lookup_min, config.prompt_lookup_max};
  options.speculative_disable_by_batch_size = config.speculative_disable_by_batch_size;
  return options;
}

Engine::Engine(LoadedModel model, const EngineOptions& options)
    : model_(std::move(model)),
      options_(options),
      saturation_(std::max(1, model_.config.num_layers)),
      seed_rng_(std::random_device{}()) {
  const ModelConfig& c = model_.config;
  if (options_.max_model_len <= 0) options_.max_model_len = c.max_position_embeddings;
  if (options_.max_model_len <= 0) throw std::invalid_argument("the model declares no context length: set --max-model-len");
  device_ = make_device(options_.device, options_.threads);
  if (options_.num_speculative_tokens < 0 || options_.ngram.min_n < 1 || options_.ngram.min_n > options_.ngram.max_n)
    throw std::invalid_argument("speculative decoding: K >= 0 and 1 <= prompt-lookup-min <= prompt-lookup-max");
  Backend& backend = *device_.backend;
  logits_ = HostArray<float>(backend);

  KvCacheSpec spec;
  spec.block_size = options_.block_size;
  spec.num_layers = c.num_layers;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.dtype = options_.kv_dtype;
  spec.window = KvWindow{options_.kv_bf16_window, options_.kv_bf16_window_values, options_.block_size};
  spec.validate();

  TransformerOptions topts;
  topts.kv_dtype = options_.kv_dtype;
  topts.block_size = options_.block_size;
  topts.num_blocks = 0;  // sized below, from what the weights and buffers left
  topts.max_num_tokens = options_.max_num_batched_tokens;
  // A speculating sequence enters the forward batch as one row per verified token (run_step),
  // and every row samples: K more of each for the sequences that may speculate in a step.
  topts.max_num_seqs = options_.max_num_seqs + options_.num_speculative_tokens *
                                                   std::min(options_.max_num_seqs, options_.speculative_disable_by_batch_size);
  topts.max_sample_rows = topts.max_num_seqs;
  topts.max_model_len = options_.max_model_len;
  topts.kv_scale_margin = options_.kv_scale_margin;
  topts.quantize_fp8 = options_.quantize_fp8;
  topts.quantize_lm_head = options_.quantize_lm_head;
  topts.window = spec.window;
  topts.graphs = backend.supports_graphs() && !options_.enforce_eager ? TransformerOptions::Graphs::on
                                                                      : TransformerOptions::Graphs::off;
  transformer_ = std::make_unique<Transformer>(c, model_.weights, backend, topts);
  model_.weights = ModelWeights{};  // the backend holds its own copy now
  if (!options_.speculative_model.empty() && options_.num_speculative_tokens > 0) {
    draft_ = std::make_unique<DraftModel>(load_model(options_.speculative_model), model_, backend,
                                          DraftOptions{options_.kv_dtype, options_.kv_scale_margin, options_.block_size,
                                                       options_.max_num_batched_tokens,
                                                       std::min(options_.max_num_seqs, options_.speculative_disable_by_batch_size),
                                                       options_.max_model_len});
  }

  uint64_t budget = options_.kv_cache_memory;
  std::string budget_source = "--kv-cache-memory";
  if (budget == 0) {
    if (const std::optional<DeviceMemory> memory = backend.memory_info()) {
      // vLLM's rule: the pool gets what is left of utilization x total once everything else
      // (weights, activation buffers, workspaces - all allocated by now - and other processes)
      // is counted as used.
      const double allowed = options_.gpu_memory_utilization * static_cast<double>(memory->total);
      const double used = static_cast<double>(memory->total - memory->free);
      budget = allowed > used ? static_cast<uint64_t>(allowed - used) : 0;
      budget_source = "--gpu-memory-utilization " + std::to_string(options_.gpu_memory_utilization).substr(0, 4) +
                      " of " + mib_text(memory->total) + ", " + mib_text(memory->total - memory->free) + " in use";
      if (budget == 0) {
        throw std::invalid_argument("the weights and buffers leave no room for the KV cache under " + budget_source +
                                    ": raise --gpu-memory-utilization, or lower --max-num-batched-tokens");
      }
    } else {
      budget = kDefaultCpuKvCacheMemory;
      budget_source = "default for the CPU";
    }
  }
  // The bf16 window's tail pool comes out of the same budget: one ring per sequence that may
  // run, as many as fit in its share (--kv-bf16-window-share); sequences beyond that run as
  // pure FP8, and a budget with no room for one ring runs without a window. So the tail never
  // makes a budget fail that the FP8 pool alone could serve.
  if (draft_) {  // the draft's pool: a share of the budget that holds as many tokens as the target's
    const uint64_t share = draft_->kv_share(budget, spec.bytes_per_token());
    draft_->allocate_kv_cache(share);
    budget -= share;
    spdlog::info("speculative decoding: draft model {}, K = {}, off above {} decoding sequences; its KV {} of the budget "
                 "({} blocks, {} bytes/token: the budget split by bytes per token, room for as many tokens in each)",
                 draft_->name(), options_.num_speculative_tokens, options_.speculative_disable_by_batch_size,
                 mib_text(draft_->kv_cache_bytes()), draft_->block_manager().num_blocks(), draft_->spec().bytes_per_token());
  }
  const KvWindow asked_window = spec.window;
  const uint64_t ring_bytes = spec.tail_bytes(1);
  const KvCacheSpec::BudgetSplit split = spec.split_budget(budget, options_.max_num_seqs, options_.max_tail_share);
  const int num_blocks = split.num_blocks;
  const int num_rings = split.num_rings;
  spec.window = split.window;
  if (num_blocks < 1) {
    throw std::invalid_argument("a KV budget of " + std::to_string(budget) + " bytes (" + budget_source +
                                ") holds no block of " + std::to_string(spec.bytes_per_block()) + " bytes: raise it");
  }
  transformer_->allocate_kv_cache(num_blocks, num_rings);

  BlockManagerOptions bopts;
  bopts.block_size = options_.block_size;
  bopts.num_layers = c.num_layers;
  bopts.num_blocks = num_blocks;
  bopts.enable_prefix_caching = options_.enable_prefix_caching;
  bopts.window = spec.window;
  bopts.num_tail_rings = num_rings;
  blocks_ = std::make_unique<BlockManager>(bopts);
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerOptions{options_.max_num_seqs, options_.max_num_batched_tokens, options_.num_speculative_tokens,
                       options_.speculative_disable_by_batch_size,
                       static_cast<int>(backend.batch_invariant_tokens())},
      *blocks_);
  if (options_.num_speculative_tokens > 0) {
    scheduler_->set_proposer([this](std::span<ProposalRequest> requests) { propose(requests); });
    if (!draft_) {
      spdlog::info("speculative decoding: ngram, up to {} tokens per step (lookup of {}-{} tokens), off above {} "
                   "decoding sequences",
                   options_.num_speculative_tokens, options_.ngram.min_n, options_.ngram.max_n,
                   options_.speculative_disable_by_batch_size);
    }
    if (const int64_t invariant = backend.batch_invariant_tokens(); invariant > 0) {
      spdlog::info("speculative decoding on {}: proposals only in steps without a prefill chunk and of at most {} "
                   "tokens, where every kernel is batch invariant (a verified token is then bitwise its decode)",
                   backend.name(), invariant);
    }
  }

  for (const int id : c.eos_token_ids) stop_ids_.push_back(id);
  if (const std::optional<int32_t> eos = model_.tokenizer->eos_id()) {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), *eos) == stop_ids_.end()) stop_ids_.push_back(*eos);
  }
  step_counts_.resize(static_cast<std::size_t>(c.num_layers));

  spdlog::info("device: {}", backend.describe());
  if (device_.kind == "cpu") {
    spdlog::info("attention: {} kernels for head_dim {}",
                 cpu::cpu_isa_name(cpu::resolve_cpu_isa(cpu::CpuIsa::best, c.head_dim)), c.head_dim);
  }
  if (backend.supports_graphs()) {
    const std::string steps = "decode steps of up to " +
                              std::to_string(std::min({options_.max_num_seqs, options_.max_num_batched_tokens, 256})) +
                              " sequences";
    if (options_.enforce_eager) {
      spdlog::info("CUDA graphs: off (--enforce-eager)");
    } else if (options_.lazy_graph_capture) {
      spdlog::info("CUDA graphs: {}, each captured on first use (--lazy-graph-capture)", steps);
    } else {
      // Every (batch-size bucket, block-table width) now, so that serving never stops to capture.
      const auto start = std::chrono::steady_clock::now();
      const int captured = transformer_->capture_decode_graphs();
      spdlog::info("CUDA graphs: {}: {} captured at start-up in {:.1f} s (--lazy-graph-capture: on first use)", steps,
                   captured, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  const std::string checkpoint = c.quantization.fp8 ? ", FP8 checkpoint (" + c.quantization.method + ")" : "";
  spdlog::info("model: {} ({}, {}, {} layers{}), weights {}", model_.name, model_.format, family_name(c.family),
               c.num_layers, checkpoint, transformer_->describe_weights());
  if (device_.kind == "cuda" && transformer_->weight_bytes_by_dtype().fp8 > 0) {
    spdlog::info("FP8 weights on CUDA: weight-only on tensor cores (the FP8 GEMV, in groups of 16 tokens)");
  }
  spdlog::info("KV cache: {} ({}), {} bytes/token, margin {}{}, max model len {}", spec.describe(num_blocks),
               budget_source, spec.bytes_per_token(), options_.kv_scale_margin,
               kv_dtype_is_scaled(options_.kv_dtype) ? "" : " (unused for bf16)", options_.max_model_len);
  std::string rings_note;
  if (asked_window.enabled() && !spec.window.enabled()) {
    rings_note = " (--kv-bf16-window " + std::to_string(asked_window.tokens) + ": one ring takes " +
                 mib_text(ring_bytes) + ", more than the window's share of this budget: every sequence runs as pure FP8)";
  } else if (spec.window.enabled()) {
    rings_note = num_rings < options_.max_num_seqs
                     ? " - rings for " + std::to_string(num_rings) + " of --max-num-seqs " +
                           std::to_string(options_.max_num_seqs) + " sequences (--kv-bf16-window-share " +
                           fmt::format("{:g}", options_.max_tail_share) + " of the budget); the others run as pure FP8"
                     : " - a ring for each of --max-num-seqs " + std::to_string(options_.max_num_seqs) + " sequences";
  }
  spdlog::info("KV {}{}{}; pool + tail {} of the {} budget", spec.describe_tail(num_rings),
               kv_dtype_is_scaled(options_.kv_dtype) ? "" : " (a bf16 pool is exact: no window)", rings_note,
               mib_text(transformer_->kv_cache_bytes() + transformer_->tail_bytes()), mib_text(budget));
  if (kv_dtype_is_scaled(options_.kv_dtype)) {
    // FP8 halves a token's bytes: the pool itself holds twice the tokens bf16 KV would in its bytes.
    spdlog::info("KV split: FP8 pool {} = {} tokens (bf16 KV would hold {} in those bytes) + bf16 window tail {}",
                 mib_text(transformer_->kv_cache_bytes()), static_cast<int64_t>(num_blocks) * spec.block_size,
                 transformer_->kv_cache_bytes() / (2 * spec.bytes_per_token()), mib_text(transformer_->tail_bytes()));
  }
}

Engine::~Engine() = default;

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
  scheduler_->add(state.seq_ids.front(), request.prompt_tokens, forks, request.num_prompt_logprobs < 0);
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

void Engine::step() {
  if (!scheduler_->has_work()) return;
  const StepPlan plan = scheduler_->schedule();
  if (plan.empty()) return;
  try {
    run_step(plan);
  } catch (const std::exception& e) {
    // An engine bug or a device failure, not a client's doing (requests are validated on
    // entry): fail every request rather than continue on a state we no longer trust.
    spdlog::error("engine step failed: {}", e.what());
    fail_all(std::string("internal error: ") + e.what());
  }
}

void Engine::run_step(const StepPlan& plan) {
  const auto step_start = std::chrono::steady_clock::now();
  const auto num_seqs = static_cast<int32_t>(plan.seqs.size());
  const int num_layers = model_config().num_layers;
  token_ids_.clear();
  positions_.clear();
  slot_mapping_.clear();
  query_start_loc_.assign(1, 0);
  context_lens_.clear();
  sample_rows_.clear();
  scorer_.clear();
  calibrate_.clear();
  fp8_lens_.clear();
  spill_starts_.clear();
  tail_slots_.clear();
  const bool window = blocks_->window().enabled();
  int32_t max_blocks = 1;
  for (const ScheduledSeq& s : plan.seqs)
    max_blocks = std::max(max_blocks, static_cast<int32_t>(blocks_->block_table(s.id).size()));
  // The forward batch's sequences: one per scheduled sequence, except that a speculating one
  // enters as 1 + proposals single-token rows, row j attending to the context up to its own
  // token - each exactly the decode step of that token, whatever the kernels (with
  // batch-invariant kernels, bitwise: README "Speculative decoding").
  batch_index_.clear();
  int32_t num_rows = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    batch_index_.push_back(num_rows);
    num_rows += s.proposals.empty() ? 1 : s.num_tokens;
  }
  block_tables_.assign(static_cast<std::size_t>(num_rows) * static_cast<std::size_t>(max_blocks), 0);
  k_scales_.assign(static_cast<std::size_t>(num_layers) * static_cast<std::size_t>(num_rows), 1.0f);
  v_scales_.assign(k_scales_.size(), 1.0f);

  for (int32_t i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& s = plan.seqs[static_cast<std::size_t>(i)];
    if (SeqState& seq = seqs_.at(s.id); !seq.scheduled) {
      seq.scheduled = true;
      RequestState& request = requests_.at(seq.request_id);
      if (request.queue_s < 0)
        request.queue_s = std::chrono::duration<double>(step_start - request.request.arrival).count();
    }
    add_score_rows(s, static_cast<int32_t>(token_ids_.size()));
    const std::span<const int32_t> tokens = blocks_->tokens(s.id);
    const std::span<const int32_t> table = blocks_->block_table(s.id);
    const KvScales& scales = blocks_->scales(s.id);
    // Where the FP8 part ends after this step: the same for every row of a speculating sequence
    // (its proposals never move the window's boundary: Scheduler::schedule_proposals).
    const int fp8_len = window ? blocks_->fp8_len_after(s.id, s.start + s.num_tokens, s.fp8_floor) : 0;
    const int rows = s.proposals.empty() ? 1 : s.num_tokens;
    for (int j = 0; j < rows; ++j) {
      const int32_t b = batch_index_[static_cast<std::size_t>(i)] + j;
      const int begin = s.start + j, end = rows == 1 ? s.start + s.num_tokens : begin + 1;
      for (int p = begin; p < end; ++p) {
        token_ids_.push_back(tokens[static_cast<std::size_t>(p)]);
        positions_.push_back(p);
        slot_mapping_.push_back(blocks_->slot(s.id, p));
      }
      query_start_loc_.push_back(static_cast<int32_t>(token_ids_.size()));
      context_lens_.push_back(end);
      if (window) {
        fp8_lens_.push_back(fp8_len);
        // The first row spills what leaves the window; the others find nothing left to spill.
        spill_starts_.push_back(j == 0 ? blocks_->num_fp8_tokens(s.id) : fp8_len);
        // A sequence without a ring reads nothing from the tail (its fp8_len is its context):
        // ring 0 only keeps the slot in range.
        tail_slots_.push_back(std::max(0, blocks_->tail_ring(s.id)));
      }
      calibrate_.push_back(s.calibrate ? 1 : 0);
      std::copy(table.begin(), table.end(), block_tables_.begin() + static_cast<std::ptrdiff_t>(b) * max_blocks);
      for (int layer = 0; layer < num_layers; ++layer) {
        k_scales_[static_cast<std::size_t>(layer * num_rows + b)] = scales.k[static_cast<std::size_t>(layer)];
        v_scales_[static_cast<std::size_t>(layer * num_rows + b)] = scales.v[static_cast<std::size_t>(layer)];
      }
    }
    if (s.samples) {  // a speculating sequence samples every row: its token's and each proposal's
      const auto last = static_cast<int32_t>(token_ids_.size()) - 1;
      for (int32_t r = last - static_cast<int32_t>(s.proposals.size()); r <= last; ++r) sample_rows_.push_back(r);
    }
  }
  const auto vocab = static_cast<std::size_t>(model_config().vocab_size);
  // No logits come back when the device samples the step (an empty span leaves them there).
  const DeviceSampling on_device = device_sampling(plan);
  logits_.resize(on_device != DeviceSampling::none ? 0 : sample_rows_.size() * vocab);

  transformer_->copy_blocks(plan.block_copies);
  ForwardBatch batch;
  batch.token_ids = token_ids_;
  batch.positions = positions_;
  batch.query_start_loc = query_start_loc_;
  batch.context_lens = context_lens_;
  batch.block_tables = block_tables_;
  batch.max_blocks_per_seq = max_blocks;
  batch.slot_mapping = slot_mapping_;
  batch.k_scales = k_scales_;
  batch.v_scales = v_scales_;
  batch.calibrate = calibrate_;
  batch.sample_rows = sample_rows_;
  batch.fp8_lens = fp8_lens_;
  batch.spill_starts = spill_starts_;
  batch.tail_slots = tail_slots_;
  batch.score_rows = scorer_.rows();
  std::fill(step_counts_.begin(), step_counts_.end(), KvWriteCounts{});
  transformer_->forward(batch, logits_.span(), step_counts_, [this](int64_t first, int64_t n, std::span<const float> logits) {
    scorer_.score(first, n, logits, device_.pool.get());
  });
  std::span<const GreedyRow> picks;
  Transformer::Candidates candidates;
  if (on_device != DeviceSampling::none) {  // logit processors and penalties, where the logits are
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
  }
  if (on_device == DeviceSampling::greedy) picks = transformer_->sample_greedy();
  if (on_device == DeviceSampling::candidates) {
    inv_temperature_.clear();
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.samples) continue;
      const auto it = seqs_.find(s.id);
      const float t = it == seqs_.end() ? 1.0f : it->second.sampler.params().temperature;
      inv_temperature_.insert(inv_temperature_.end(), 1 + s.proposals.size(), t > 1e-5f ? 1.0f / t : 1.0f);  // the host draw's 1/T
    }
    candidates = transformer_->sample_candidates(inv_temperature_);
  }
  for (int layer = 0; layer < num_layers; ++layer) saturation_.add(layer, step_counts_[static_cast<std::size_t>(layer)]);

  // Calibrated scales go to the block manager before on_step_done freezes them.
  for (int32_t i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& s = plan.seqs[static_cast<std::size_t>(i)];
    if (!s.calibrate) continue;
    KvScales* scales = blocks_->scales_to_calibrate(s.id);
    if (scales == nullptr) throw std::logic_error("calibrating a sequence whose scales are frozen");
    const auto at = static_cast<std::size_t>(batch_index_[static_cast<std::size_t>(i)]);
    for (int layer = 0; layer < num_layers; ++layer) {
      scales->k[static_cast<std::size_t>(layer)] = k_scales_[static_cast<std::size_t>(layer * num_rows) + at];
      scales->v[static_cast<std::size_t>(layer)] = v_scales_[static_cast<std::size_t>(layer * num_rows) + at];
    }
  }
  scheduler_->on_step_done(plan);
  if (window) {  // a fork owns a ring of its own: the parent's window, copied
    tail_copies_.clear();
    for (const ScheduledSeq& s : plan.seqs) {
      for (const SeqId child : s.forks)
        if (blocks_->tail_ring(child) >= 0) tail_copies_.push_back({blocks_->tail_ring(s.id), blocks_->tail_ring(child)});
    }
    transformer_->copy_tail_rings(tail_copies_);
  }

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
  // A row sampled where the step's logits are: nullopt when the device's candidates cannot
  // decide it (nothing recorded; the caller samples the row itself).
  auto sample_on_device = [&](Sampler& sampler, std::size_t row) -> std::optional<SampleResult> {
    if (on_device == DeviceSampling::greedy) return sampler.accept_greedy(picks[row]);
    const auto k = static_cast<std::size_t>(candidates.rows[row].num_candidates);
    const auto at = row * static_cast<std::size_t>(candidates.k);
    return sampler.sample_candidates(candidates.rows[row], {candidates.ids + at, k}, {candidates.logits + at, k},
                                     static_cast<int64_t>(vocab));
  };
  auto sample_row = [&](int64_t j) {
    const std::size_t i = parallel[static_cast<std::size_t>(j)];
    Pending& p = pending[i];
    Sampler& sampler = seqs_.at(p.id).sampler;
    if (on_device != DeviceSampling::none) {
      if (const std::optional<SampleResult> drawn = sample_on_device(sampler, p.row)) p.sample = *drawn;
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
                     sample_structured_on_device(id, seq, sample_on_device(seq.sampler, p.row), static_cast<int64_t>(p.row))) {
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
        if (std::optional<SampleResult> drawn = sample_on_device(seq.sampler, r)) return drawn;
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

void Engine::propose(std::span<ProposalRequest> requests) {
  std::vector<DraftJob> jobs;
  for (ProposalRequest& r : requests) {
    r.out.clear();
    const SeqState& seq = seqs_.at(r.id);
    if (!seq.gate.allows(seq.num_generated)) continue;
    // The step samples 1 + accepted tokens: no proposal past what the request may still generate.
    const auto max_tokens = static_cast<int>(std::min<int64_t>(r.max_tokens, token_budget(seq) - 1));
    if (!draft_) ngram_propose(r.tokens, options_.ngram, max_tokens, r.out);
    else jobs.push_back({r.id, r.tokens, max_tokens, &r.out, static_cast<int>(requests_.at(seq.request_id).request.prompt_tokens.size())});
  }
  if (draft_ && !jobs.empty()) draft_->propose(jobs);  // one batch: its decode passes run every sequence
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

Engine::DeviceSampling Engine::device_sampling(const StepPlan& plan) const {
  if (!options_.device_sampling || !transformer_->samples_on_device()) return DeviceSampling::none;
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

void Engine::attach_prompt_logprobs(SeqState& seq, RequestOutput& out) {
  if (seq.prompt_logprobs_sent) return;
  seq.prompt_logprobs_sent = true;
  const RequestState& request = requests_.at(seq.request_id);
  if (request.request.num_prompt_logprobs >= 0) out.prompt_logprobs = request.prompt_logprobs;
}

std::nullopt_t Engine::fail_structured(SeqId id, const char* message) {
  RequestOutput out;
  out.error = message;
  finish_seq(id, out, FinishReason::error);
  return std::nullopt;
}

bool Engine::fill_token_mask(SeqState& seq, std::span<float> row) {
  grammar::GrammarMatcher& matcher = *seq.matcher;
  const auto t0 = std::chrono::steady_clock::now();
  token_mask_.resize(static_cast<size_t>(matcher.grammar().vocab().mask_words()));
  matcher.fill_next_token_bitmask(token_mask_);
  const bool any = grammar::bitmask_count(token_mask_) > 0;
  if (!row.empty()) grammar::apply_token_bitmask(token_mask_, row);
  grammar_mask_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++grammar_mask_count_;
  return any;
}

std::optional<SampleResult> Engine::sample_structured(SeqId id, SeqState& seq, std::span<const float> logits) {
  if (!fill_token_mask(seq, row_)) return fail_structured(id, kNoContinuation);
  return check_structured(id, seq, seq.sampler.sample(row_), [&](std::span<const uint64_t> mask) {
    row_.assign(logits.begin(), logits.end());
    grammar::apply_token_bitmask(mask, row_);
    return seq.sampler.sample(row_);
  });
}

std::optional<SampleResult> Engine::sample_structured_on_device(SeqId id, SeqState& seq, std::optional<SampleResult> sample,
                                                                int64_t row) {
  // The processed row (grammar mask and processors applied on the device), narrowed further by
  // `mask` (the budget's) if given, sampled without processing again.
  auto processed = [&](std::span<const uint64_t> mask) {
    logits_.resize(static_cast<std::size_t>(model_config().vocab_size));
    transformer_->download_logits_row(row, logits_.span());
    if (!mask.empty()) grammar::apply_token_bitmask(mask, logits_.span());
    return seq.sampler.sample_processed(logits_.span());
  };
  if (!sample) sample = processed({});  // the candidates could not decide
  return check_structured(id, seq, *sample, processed);
}

std::optional<SampleResult> Engine::check_structured(SeqId id, SeqState& seq, SampleResult sample,
                                                     const std::function<SampleResult(std::span<const uint64_t>)>& resample) {
  grammar::GrammarMatcher& matcher = *seq.matcher;
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t budget = token_budget(seq);  // this token included
  if (!seq.budget_free && !matcher.fits_after(sample.token, budget - 1)) {
    // That token would leave more to write than the budget allows: sample again among the
    // tokens after which the document can still end in time (only its shortest ways once the
    // budget equals the fewest tokens left).
    token_mask_.resize(static_cast<size_t>(matcher.grammar().vocab().mask_words()));
    const bool settled = matcher.fill_budget_bitmask(token_mask_, budget - 1);
    if (grammar::bitmask_count(token_mask_) > 0) {
      seq.sampler.forget(sample.token);
      sample = resample(token_mask_);
    } else if (matcher.can_end()) {  // complete, and only the end token it may not write would fit
      RequestOutput out;
      finish_seq(id, out, FinishReason::stop);
      return std::nullopt;
    } else if (settled) {
      // No complete document fits in max_tokens: the model writes on, and the budget cuts the
      // text ("length"), as OpenAI does.
      seq.budget_free = true;
    }  // else no way is known within the search's work: the model's token stands
  }
  grammar_budget_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  if (!matcher.accept_token(sample.token))  // a masked token was sampled: a bug, not the client's doing
    return fail_structured(id, "structured output: the sampler chose a token the grammar does not allow");
  return sample;
}

int64_t Engine::token_budget(const SeqState& seq) const {
  const GenerationRequest& r = requests_.at(seq.request_id).request;
  const int64_t by_length = static_cast<int64_t>(options_.max_model_len) - static_cast<int64_t>(r.prompt_tokens.size()) - seq.num_generated;
  return std::min<int64_t>(r.max_tokens - seq.num_generated, by_length);
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
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  const int total = blocks_->num_blocks();
  s.kv_usage = total > 0 ? static_cast<double>(total - blocks_->num_free_blocks()) / total : 0.0;
  if (const int rings = blocks_->num_tail_rings(); rings > 0) {
    s.kv_tail_usage = static_cast<double>(rings - blocks_->num_free_tail_rings()) / rings;
  }
  s.kv_ringless_seqs = blocks_->num_seqs_without_ring();
  s.num_preemptions = scheduler_->num_preemptions();
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
