// The engine's start-up (engine.hpp): the device, the weights uploaded, the KV budget split
// between the draft's pool, the FP8 pool and the bf16 window's rings, the scheduler, and the
// start-up log that says which device, how many KV blocks and which dtype.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "kernels/cpu/cpu_backend.hpp"
#include "server/engine/engine.hpp"

namespace fp8serve {

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

  kv_.spec.block_size = options_.block_size;
  kv_.spec.num_layers = c.num_layers;
  kv_.spec.num_kv_heads = c.num_kv_heads;
  kv_.spec.head_dim = c.head_dim;
  kv_.spec.dtype = options_.kv_dtype;
  kv_.spec.window = KvWindow{options_.kv_bf16_window, options_.kv_bf16_window_values, options_.block_size};
  kv_.spec.validate();

  TransformerOptions topts;
  topts.kv_dtype = options_.kv_dtype;
  topts.block_size = options_.block_size;
  topts.num_blocks = 0;  // sized below, from what the weights and buffers left
  topts.max_num_tokens = options_.max_num_batched_tokens;
  // A speculating sequence enters the forward batch as one row per verified token (step
  // inputs), and every row samples: K more of each for the sequences that may speculate in a step.
  topts.max_num_seqs = options_.max_num_seqs + options_.num_speculative_tokens *
                                                   std::min(options_.max_num_seqs, options_.speculative_disable_by_batch_size);
  topts.max_sample_rows = topts.max_num_seqs;
  topts.max_model_len = options_.max_model_len;
  topts.kv_scale_margin = options_.kv_scale_margin;
  topts.quantize_fp8 = options_.quantize_fp8;
  topts.quantize_lm_head = options_.quantize_lm_head;
  topts.window = kv_.spec.window;
  // Rotation only changes how FP8 rounds: a bf16 pool stores heads as computed.
  const KvRotation rotation = kv_dtype_is_scaled(options_.kv_dtype) ? options_.kv_rotation : KvRotation::none;
  topts.kv_rotation = rotation;
  topts.graphs = backend.supports_graphs() && !options_.enforce_eager ? TransformerOptions::Graphs::on
                                                                      : TransformerOptions::Graphs::off;
  transformer_ = std::make_unique<Transformer>(c, model_.weights, backend, topts);
  model_.weights = ModelWeights{};  // the backend holds its own copy now
  if (!options_.speculative_model.empty() && options_.num_speculative_tokens > 0) {
    draft_ = std::make_unique<DraftModel>(load_model(options_.speculative_model), model_, backend,
                                          DraftOptions{options_.kv_dtype, rotation, options_.kv_scale_margin, options_.block_size,
                                                       options_.max_num_batched_tokens,
                                                       std::min(options_.max_num_seqs, options_.speculative_disable_by_batch_size),
                                                       options_.max_model_len});
  }

  size_kv_cache();
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerOptions{options_.max_num_seqs, options_.max_num_batched_tokens, options_.num_speculative_tokens,
                       options_.speculative_disable_by_batch_size,
                       static_cast<int>(backend.batch_invariant_tokens()), options_.priority_scheduling},
      *blocks_);
  inputs_ = std::make_unique<StepInputs>(*blocks_, c.num_layers);
  log_speculation();

  for (const int id : c.eos_token_ids) stop_ids_.push_back(id);
  if (const std::optional<int32_t> eos = model_.tokenizer->eos_id()) {
    if (std::find(stop_ids_.begin(), stop_ids_.end(), *eos) == stop_ids_.end()) stop_ids_.push_back(*eos);
  }
  step_counts_.resize(static_cast<std::size_t>(c.num_layers));
  log_startup();
}

Engine::~Engine() = default;

// The KV budget: --kv-cache-memory, else on a GPU what utilization x its memory leaves once
// everything else is in use (vLLM's rule), else the CPU's default. The draft's pool takes its
// share first; the bf16 window's rings come out of the rest (KvCacheSpec::split_budget), as many
// as fit in their share (--kv-bf16-window-share): every running sequence holds one, so they cap
// how many run at once; a budget with no room for one ring runs without a window, so the tail never makes a budget fail
// that the FP8 pool alone could serve.
void Engine::size_kv_cache() {
  Backend& backend = *device_.backend;
  uint64_t kv_bytes = options_.kv_cache_memory;
  std::string kv_bytes_source = "--kv-cache-memory";
  if (kv_bytes == 0) {
    if (const std::optional<DeviceMemory> memory = backend.memory_info()) {
      // Weights, activation buffers, workspaces - all allocated by now - and other processes
      // count as used.
      const double allowed = options_.gpu_memory_utilization * static_cast<double>(memory->total);
      const double used = static_cast<double>(memory->total - memory->free);
      kv_bytes = allowed > used ? static_cast<uint64_t>(allowed - used) : 0;
      kv_bytes_source = "--gpu-memory-utilization " + std::to_string(options_.gpu_memory_utilization).substr(0, 4) +
                        " of " + mib_text(memory->total) + ", " + mib_text(memory->total - memory->free) + " in use";
      if (kv_bytes == 0) {
        throw std::invalid_argument("the weights and buffers leave no room for the KV cache under " + kv_bytes_source +
                                    ": raise --gpu-memory-utilization, or lower --max-num-batched-tokens");
      }
    } else {
      kv_bytes = kDefaultCpuKvCacheMemory;
      kv_bytes_source = "default for the CPU";
    }
  }
  if (draft_) {  // the draft's pool: a share of the budget that holds as many tokens as the target's
    const uint64_t share = draft_->kv_share(kv_bytes, kv_.spec.bytes_per_token());
    draft_->allocate_kv_cache(share);
    kv_bytes -= share;
    spdlog::info("speculative decoding: draft model {}, K = {}, off above {} decoding sequences; its KV {} of the budget "
                 "({} blocks, {} bytes/token: the budget split by bytes per token, room for as many tokens in each)",
                 draft_->name(), options_.num_speculative_tokens, options_.speculative_disable_by_batch_size,
                 mib_text(draft_->kv_cache_bytes()), draft_->block_manager().num_blocks(), draft_->spec().bytes_per_token());
  }
  kv_.asked_window = kv_.spec.window;
  kv_.ring_bytes = kv_.spec.tail_bytes(1);
  const KvCacheSpec::BudgetSplit split = kv_.spec.split_budget(kv_bytes, options_.max_num_seqs, options_.max_tail_share);
  kv_.num_blocks = split.num_blocks;
  kv_.num_rings = split.num_rings;
  kv_.spec.window = split.window;
  kv_.bytes = kv_bytes;
  kv_.bytes_source = kv_bytes_source;
  if (kv_.num_blocks < 1) {
    throw std::invalid_argument("a KV budget of " + std::to_string(kv_bytes) + " bytes (" + kv_bytes_source +
                                ") holds no block of " + std::to_string(kv_.spec.bytes_per_block()) + " bytes: raise it");
  }
  transformer_->allocate_kv_cache(kv_.num_blocks, kv_.num_rings);

  BlockManagerOptions bopts;
  bopts.block_size = options_.block_size;
  bopts.num_layers = model_.config.num_layers;
  bopts.num_blocks = kv_.num_blocks;
  bopts.enable_prefix_caching = options_.enable_prefix_caching;
  bopts.window = kv_.spec.window;
  bopts.num_tail_rings = kv_.num_rings;
  blocks_ = std::make_unique<BlockManager>(bopts);
}

void Engine::log_speculation() const {
  if (options_.num_speculative_tokens <= 0) return;
  if (!draft_) {
    spdlog::info("speculative decoding: ngram, up to {} tokens per step (lookup of {}-{} tokens), off above {} "
                 "decoding sequences",
                 options_.num_speculative_tokens, options_.ngram.min_n, options_.ngram.max_n,
                 options_.speculative_disable_by_batch_size);
  }
  const Backend& backend = *device_.backend;
  if (const int64_t invariant = backend.batch_invariant_tokens(); invariant > 0) {
    spdlog::info("speculative decoding on {}: proposals only in steps without a prefill chunk and of at most {} "
                 "tokens, where every kernel is batch invariant (a verified token is then bitwise its decode)",
                 backend.name(), invariant);
  }
}

void Engine::log_startup() {
  const ModelConfig& c = model_.config;
  const Backend& backend = *device_.backend;
  const KvCacheSpec& spec = kv_.spec;
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
  spdlog::info("KV cache: {} ({}), {} bytes/token, margin {}{}, rotation {}, max model len {}",
               spec.describe(kv_.num_blocks), kv_.bytes_source, spec.bytes_per_token(), options_.kv_scale_margin,
               kv_dtype_is_scaled(options_.kv_dtype) ? "" : " (unused for bf16)", kv_rotation_name(transformer_->options().kv_rotation),
               options_.max_model_len);
  std::string rings_note;
  if (kv_.asked_window.enabled() && !spec.window.enabled()) {
    rings_note = " (--kv-bf16-window " + std::to_string(kv_.asked_window.tokens) + ": one ring takes " +
                 mib_text(kv_.ring_bytes) + ", more than the window's share of this budget: every sequence runs as pure FP8)";
  } else if (spec.window.enabled()) {
    rings_note = kv_.num_rings < options_.max_num_seqs
                     ? " - rings for " + std::to_string(kv_.num_rings) + " of --max-num-seqs " +
                           std::to_string(options_.max_num_seqs) + " sequences (--kv-bf16-window-share " +
                           fmt::format("{:g}", options_.max_tail_share) + " of the budget): at most " +
                           std::to_string(kv_.num_rings) + " run at once, the others wait for a ring"
                     : " - a ring for each of --max-num-seqs " + std::to_string(options_.max_num_seqs) + " sequences";
  }
  spdlog::info("KV {}{}{}; pool + tail {} of the {} budget", spec.describe_tail(kv_.num_rings),
               kv_dtype_is_scaled(options_.kv_dtype) ? "" : " (a bf16 pool is exact: no window)", rings_note,
               mib_text(transformer_->kv_cache_bytes() + transformer_->tail_bytes()), mib_text(kv_.bytes));
  if (kv_dtype_is_scaled(options_.kv_dtype)) {
    // FP8 halves a token's bytes: the pool itself holds twice the tokens bf16 KV would in its bytes.
    spdlog::info("KV split: FP8 pool {} = {} tokens (bf16 KV would hold {} in those bytes) + bf16 window tail {}",
                 mib_text(transformer_->kv_cache_bytes()), static_cast<int64_t>(kv_.num_blocks) * spec.block_size,
                 transformer_->kv_cache_bytes() / (2 * spec.bytes_per_token()), mib_text(transformer_->tail_bytes()));
  }
  spdlog::info("scheduler: {}, up to {} sequences and {} tokens per step",
               options_.priority_scheduling ? "priority (lower \"priority\" first; less urgent requests are preempted for it)"
                                            : "first come, first served",
               options_.max_num_seqs, options_.max_num_batched_tokens);
}

}  // namespace fp8serve
