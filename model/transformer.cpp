#include "model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"  // rope_inv_freq: host-side math shared by every backend
#include "model/decode_graphs.hpp"

namespace fp8serve {

namespace {

std::string layer_name(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

// inv_freq as transformers computes it for this config (default or llama3 scaling).
std::vector<float> model_inv_freq(const ModelConfig& c) {
  cpu::RopeConfig rope;
  rope.rotary_dim = c.head_dim;
  rope.theta = c.rope_theta;
  if (c.rope_scaling.kind == RopeScaling::Kind::llama3) {
    rope.scaling = cpu::RopeScaling::llama3;
    rope.factor = c.rope_scaling.factor;
    rope.low_freq_factor = c.rope_scaling.low_freq_factor;
    rope.high_freq_factor = c.rope_scaling.high_freq_factor;
    rope.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  }
  return cpu::rope_inv_freq(rope);
}

template <typename T>
DeviceBuffer device_array(Backend& backend, std::size_t count) {
  return DeviceBuffer(backend, count * sizeof(T));
}

// Block src -> dst of every pool in `views` (one per layer), for each copy.
void copy_pool_blocks(Backend& backend, Stream stream, const std::vector<PagedKvView>& views,
                      const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
  if (src.empty()) return;
  CopyBlocksParams p;
  p.layers = views.data();
  p.num_layers = static_cast<int32_t>(views.size());
  p.src = src.data();
  p.dst = dst.data();
  p.num_copies = static_cast<int32_t>(src.size());
  backend.copy_blocks(p, stream);
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend,
                         const TransformerOptions& options)
    : config_(config), backend_(backend), options_(options) {
  act_bytes_ = backend.activation_dtype() == ActDtype::f32 ? sizeof(float) : sizeof(std::uint16_t);
  if (options.num_blocks < 0 || options.block_size < 1 || options.max_num_tokens < 1 ||
      options.max_num_seqs < 1 || options.max_model_len < 1) {
    throw std::invalid_argument("Transformer: block_size, max_num_tokens, max_num_seqs and "
                                "max_model_len must be >= 1, num_blocks >= 0");
  }
  validate_kv_scale_margin(options.kv_scale_margin);
  options.window.validate();
  if (options.window.enabled() &&
      (options.kv_dtype != KvDtype::fp8_e4m3 || options.window.block_size != options.block_size)) {
    throw std::invalid_argument("Transformer: the bf16 window needs the FP8 pool and its block size");
  }
  const ModelConfig& c = config_;

  // Weights: uploaded once under the layer's named slots; q/k/v and gate/up fused. Twice over the
  // same calls: a planning pass sizes the one arena they all live in (weight_upload.hpp).
  const bool quantize = options.quantize_fp8;
  WeightUploader plan(backend_, stream_, weight_buffers_, /*planning=*/true);
  upload_weights(weights, plan, quantize);
  if (plan.bytes().fp8 > 0 && !backend_.supports_weight_dtype(WeightDtype::fp8_e4m3)) {
    throw std::invalid_argument(std::string("the ") + std::string(backend_.name()) +
                                " backend does not support FP8 weights yet (--quantization fp8, or an FP8 "
                                "checkpoint): run on --device cpu");
  }
  WeightUploader up(backend_, stream_, weight_buffers_, /*planning=*/false, plan.bytes().arena);
  upload_weights(weights, up, quantize);
  weight_bytes_ = up.bytes();
  backend_.set_rope_table(model_inv_freq(c), options.max_model_len);

  // Activations for the largest step, in the backend's activation dtype; logits in fp32.
  const auto rows = static_cast<std::size_t>(options.max_num_tokens);
  const auto seqs = static_cast<std::size_t>(options.max_num_seqs);
  if (options_.max_sample_rows <= 0) options_.max_sample_rows = options.max_num_seqs;
  const auto sampled_rows = static_cast<std::size_t>(options_.max_sample_rows);
  const auto hidden = static_cast<std::size_t>(c.hidden_size);
  const auto q_width = static_cast<std::size_t>(c.num_heads * c.head_dim);
  const auto qkv_width = static_cast<std::size_t>((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
  auto activations = [&](std::size_t count) { return DeviceBuffer(backend_, count * act_bytes_); };
  hidden_ = activations(rows * hidden);
  normed_ = activations(rows * hidden);
  qkv_ = activations(rows * qkv_width);
  attn_out_ = activations(rows * q_width);
  proj_out_ = activations(rows * hidden);
  gate_up_ = activations(rows * 2 * static_cast<std::size_t>(c.intermediate_size));
  sampled_ = activations(std::max(seqs, sampled_rows) * hidden);
  sampled_delta_ = activations(std::max(seqs, sampled_rows) * hidden);
  logits_ = device_array<float>(backend_, std::max(seqs, sampled_rows) * static_cast<std::size_t>(c.vocab_size));

  const auto max_blocks = static_cast<std::size_t>((options.max_model_len + options.block_size - 1) /
                                                   options.block_size);
  const std::size_t meta_bytes = step_layout(rows, seqs, max_blocks, rows).end;
  step_meta_ = DeviceBuffer(backend_, meta_bytes);
  step_host_ = HostArray<std::byte>(backend_);
  step_host_.resize(meta_bytes);
  score_logits_ = HostArray<float>(backend_);

  // The attention's workspace for the largest step is taken now, before the engine sizes the
  // KV pool from the device memory left.
  backend_.reserve_attention_workspace(options.max_num_seqs, c.num_heads, c.num_kv_heads, c.head_dim,
                                       options.max_model_len);
  if (options.graphs == TransformerOptions::Graphs::on && !backend_.supports_graphs())
    throw std::invalid_argument("Transformer: graphs on a backend without graphs");
  if (options.graphs != TransformerOptions::Graphs::off)
    graph_buckets_ = graph_batch_sizes(std::min(options.max_num_seqs, options.max_num_tokens));

  if (options.num_blocks > 0) allocate_kv_cache(options.num_blocks);
}

void Transformer::upload_weights(const ModelWeights& weights, WeightUploader& up, bool quantize) {
  const ModelConfig& c = config_;
  embed_tokens_ = up.bf16(weights, {"model.embed_tokens.weight"});
  final_norm_ = up.bf16(weights, {"model.norm.weight"});
  const std::string head_name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (c.tie_word_embeddings && !(quantize && options_.quantize_lm_head)) {
    lm_head_.weight = embed_tokens_;  // the table itself
    lm_head_.out_features = c.vocab_size;
    lm_head_.in_features = c.hidden_size;
  } else {
    lm_head_ = up.projection(weights, {head_name}, quantize && options_.quantize_lm_head);
  }
  layers_.resize(static_cast<std::size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& w = layers_[static_cast<std::size_t>(i)];
    auto name = [i](const char* suffix) { return layer_name(i, suffix); };
    w.input_norm = up.bf16(weights, {name("input_layernorm.weight")});
    w.qkv_proj = up.projection(weights, {name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"),
                                         name("self_attn.v_proj.weight")}, quantize);
    if (c.attention_bias) {
      w.qkv_bias = up.bf16(weights, {name("self_attn.q_proj.bias"), name("self_attn.k_proj.bias"),
                                     name("self_attn.v_proj.bias")});
    }
    if (c.qk_norm) {
      w.q_norm = up.bf16(weights, {name("self_attn.q_norm.weight")});
      w.k_norm = up.bf16(weights, {name("self_attn.k_norm.weight")});
    }
    w.o_proj = up.projection(weights, {name("self_attn.o_proj.weight")}, quantize);
    w.post_norm = up.bf16(weights, {name("post_attention_layernorm.weight")});
    w.gate_up_proj = up.projection(weights, {name("mlp.gate_proj.weight"), name("mlp.up_proj.weight")}, quantize);
    w.down_proj = up.projection(weights, {name("mlp.down_proj.weight")}, quantize);
  }
}

void Transformer::allocate_kv_cache(int num_blocks, int num_tail_rings) {
  if (has_kv_cache()) throw std::logic_error("Transformer: the KV pool is already allocated");
  if (num_blocks < 1) throw std::invalid_argument("Transformer: the KV pool needs num_blocks >= 1");
  const ModelConfig& c = config_;
  options_.num_blocks = num_blocks;
  // One K and one V buffer per layer.
  const std::size_t pool_elems = static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(options_.block_size) *
                                 static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim);
  const std::size_t pool_bytes = pool_elems * kv_dtype_size(options_.kv_dtype);
  for (int i = 0; i < c.num_layers; ++i) {
    DeviceBuffer k(backend_, pool_bytes);
    DeviceBuffer v(backend_, pool_bytes);
    kv_views_.push_back(make_paged_kv_view(k.data(), v.data(), options_.kv_dtype, num_blocks,
                                           options_.block_size, c.num_kv_heads, c.head_dim));
    kv_buffers_.push_back(std::move(k));
    kv_buffers_.push_back(std::move(v));
    kv_cache_bytes_ += 2 * pool_bytes;
  }
  // The window's tail pool: the same layout in bf16, one ring per sequence that may use one.
  if (num_tail_rings == 0) options_.window = KvWindow{};
  const KvWindow& window = options_.window;
  if (!window.enabled()) return;
  const int tail_blocks = (num_tail_rings < 0 ? options_.max_num_seqs : num_tail_rings) * window.ring_blocks();
  const std::size_t tail_bytes = static_cast<std::size_t>(tail_blocks) * static_cast<std::size_t>(options_.block_size) *
                                 static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim) *
                                 kv_dtype_size(KvDtype::bf16);
  for (int i = 0; i < c.num_layers; ++i) {
    DeviceBuffer k(backend_, tail_bytes);
    DeviceBuffer v = window.values ? DeviceBuffer(backend_, tail_bytes) : DeviceBuffer();
    tail_views_.push_back(make_paged_kv_view(k.data(), v.data(), KvDtype::bf16, tail_blocks, options_.block_size,
                                             c.num_kv_heads, c.head_dim));
    tail_bytes_ += k.bytes() + v.bytes();
    tail_buffers_.push_back(std::move(k));
    tail_buffers_.push_back(std::move(v));
  }
}

std::string mib_text(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string Transformer::describe_weights() const {
  const WeightBytes& b = weight_bytes_;
  std::string out = mib_text(b.total());
  if (b.fp8 == 0) return out + " bf16";
  return out + ": FP8 projections " + mib_text(b.fp8) + " + scales " + mib_text(b.fp8_scales) + " (bf16 would be " +
         mib_text(b.fp8_as_bf16) + "), bf16 " + mib_text(b.bf16) +
         (lm_head_.dtype == WeightDtype::fp8_e4m3 ? " (embeddings, norms; LM head FP8)" : " (embeddings, norms, LM head)");
}

void Transformer::validate(const ForwardBatch& b, std::span<float> logits) const {
  const auto num_tokens = static_cast<int64_t>(b.token_ids.size());
  const auto num_seqs = static_cast<int64_t>(b.context_lens.size());
  const auto num_layers = static_cast<std::size_t>(config_.num_layers);
  const int64_t max_blocks = (options_.max_model_len + options_.block_size - 1) / options_.block_size;
  auto fail = [](const std::string& what) { throw std::invalid_argument("Transformer::forward: " + what); };
  if (num_tokens < 1 || num_tokens > options_.max_num_tokens) fail("num_tokens outside [1, max_num_tokens]");
  if (num_seqs < 1 || num_seqs > options_.max_num_seqs) fail("num_seqs outside [1, max_num_seqs]");
  if (b.positions.size() != b.token_ids.size() || b.slot_mapping.size() != b.token_ids.size())
    fail("positions and slot_mapping need one entry per token");
  if (b.query_start_loc.size() != static_cast<std::size_t>(num_seqs + 1) ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != num_tokens)
    fail("query_start_loc must be [num_seqs + 1] from 0 to num_tokens");
  if (b.max_blocks_per_seq < 1 || b.max_blocks_per_seq > max_blocks ||
      b.block_tables.size() != static_cast<std::size_t>(num_seqs * b.max_blocks_per_seq))
    fail("block_tables must be [num_seqs, max_blocks_per_seq] with max_blocks_per_seq <= max_model_len / block_size");
  if (b.k_scales.size() != num_layers * static_cast<std::size_t>(num_seqs) ||
      b.v_scales.size() != b.k_scales.size())
    fail("k_scales and v_scales must be [num_layers, num_seqs]");
  if (b.calibrate.size() != static_cast<std::size_t>(num_seqs)) fail("calibrate must be [num_seqs]");
  if (b.sample_rows.size() > static_cast<std::size_t>(options_.max_sample_rows))
    fail("more sample rows than max_sample_rows");
  for (const int32_t row : b.sample_rows)
    if (row < 0 || row >= num_tokens) fail("a sample row outside [0, num_tokens)");
  if (b.score_rows.size() > static_cast<std::size_t>(num_tokens)) fail("more score rows than tokens");
  for (const int32_t row : b.score_rows)
    if (row < 0 || row >= num_tokens) fail("a score row outside [0, num_tokens)");
  if (!logits.empty() && logits.size() != b.sample_rows.size() * static_cast<std::size_t>(config_.vocab_size))
    fail("logits must be [sample_rows, vocab_size] or empty (left on the device)");
  for (const int64_t s : b.slot_mapping)
    if (s >= static_cast<int64_t>(options_.num_blocks) * options_.block_size) fail("slot outside the pool");
  for (const int32_t p : b.positions)
    if (p < 0 || p >= options_.max_model_len) fail("position outside [0, max_model_len)");
  // The embedding op checks ids too, but a device backend can only report after the fact.
  for (const int32_t id : b.token_ids) {
    if (id < 0 || id >= config_.vocab_size) {
      throw std::out_of_range("embedding: token id " + std::to_string(id) + " outside the vocabulary [0, " +
                              std::to_string(config_.vocab_size) + ")");
    }
  }
  const std::size_t window_fields = options_.window.enabled() ? static_cast<std::size_t>(num_seqs) : 0;
  if (b.fp8_lens.size() != window_fields || b.spill_starts.size() != window_fields ||
      b.tail_slots.size() != window_fields)
    fail("fp8_lens, spill_starts and tail_slots must be [num_seqs] with the bf16 window, empty without");
}

Transformer::StepLayout Transformer::step_layout(std::size_t num_tokens, std::size_t num_seqs,
                                                 std::size_t max_blocks_per_seq, std::size_t num_score_rows) const {
  StepLayout l;
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t offset = at;
    at = (at + bytes + 15) / 16 * 16;
    return offset;
  };
  const auto layers = static_cast<std::size_t>(config_.num_layers);
  l.token_ids = take(num_tokens * sizeof(int32_t));
  l.positions = take(num_tokens * sizeof(int32_t));
  l.slot_mapping = take(num_tokens * sizeof(int64_t));
  l.query_start_loc = take((num_seqs + 1) * sizeof(int32_t));
  l.context_lens = take(num_seqs * sizeof(int32_t));
  l.block_tables = take(num_seqs * max_blocks_per_seq * sizeof(int32_t));
  l.calibrate = take(num_seqs * sizeof(uint8_t));
  l.sample_rows = take(std::max(num_seqs, num_tokens) * sizeof(int32_t));  // speculation: up to a row per token
  l.score_rows = take(num_score_rows * sizeof(int32_t));
  const std::size_t window_seqs = options_.window.enabled() ? num_seqs : 0;
  l.fp8_lens = take(window_seqs * sizeof(int32_t));
  l.spill_starts = take(window_seqs * sizeof(int32_t));
  l.tail_slots = take(window_seqs * sizeof(int32_t));
  l.k_scales = take(layers * num_seqs * sizeof(float));
  l.v_scales = take(layers * num_seqs * sizeof(float));
  l.counts = take(layers * sizeof(KvWriteCounts));
  l.end = at;
  return l;
}

void Transformer::upload_batch(const ForwardBatch& b, const StepLayout& layout, bool track_counts) {
  auto put = [&](std::size_t offset, auto span) {
    if (span.size_bytes()) std::memcpy(step_host_.data() + offset, span.data(), span.size_bytes());
  };
  put(layout.token_ids, b.token_ids);
  put(layout.positions, b.positions);
  put(layout.slot_mapping, b.slot_mapping);
  put(layout.query_start_loc, b.query_start_loc);
  put(layout.context_lens, b.context_lens);
  put(layout.block_tables, b.block_tables);
  put(layout.calibrate, b.calibrate);
  put(layout.sample_rows, b.sample_rows);
  put(layout.score_rows, b.score_rows);
  put(layout.fp8_lens, b.fp8_lens);
  put(layout.spill_starts, b.spill_starts);
  put(layout.tail_slots, b.tail_slots);
  put(layout.k_scales, std::span<const float>(b.k_scales));
  put(layout.v_scales, std::span<const float>(b.v_scales));
  const std::size_t end = track_counts ? layout.end : layout.counts;
  if (track_counts) std::memset(step_host_.data() + layout.counts, 0, end - layout.counts);
  backend_.copy_to_device(step_meta_.data(), step_host_.data(), end, stream_);
}

ForwardBatch HostBatch::view() {
  ForwardBatch b;
  b.token_ids = token_ids;
  b.positions = positions;
  b.query_start_loc = query_start_loc;
  b.context_lens = context_lens;
  b.block_tables = block_tables;
  b.max_blocks_per_seq = max_blocks_per_seq;
  b.slot_mapping = slot_mapping;
  b.k_scales = k_scales;
  b.v_scales = v_scales;
  b.calibrate = calibrate;
  b.sample_rows = sample_rows;
  b.score_rows = score_rows;
  b.fp8_lens = fp8_lens;
  b.spill_starts = spill_starts;
  b.tail_slots = tail_slots;
  return b;
}

void Transformer::forward(const ForwardBatch& b, std::span<float> logits, std::span<KvWriteCounts> counts,
                          const ScoreFn& score) {
  if (!has_kv_cache()) throw std::logic_error("Transformer::forward: allocate_kv_cache() was not called");
  validate(b, logits);
  // Scoring reruns the LM head into logits_: the sample rows' logits are gone after it.
  last_sample_rows_ = b.score_rows.empty() ? static_cast<int64_t>(b.sample_rows.size()) : -1;
  if (!counts.empty() && counts.size() != static_cast<std::size_t>(config_.num_layers))
    throw std::invalid_argument("Transformer::forward: counts must be [num_layers]");
  const auto num_seqs = static_cast<int32_t>(b.context_lens.size());
  StepShape shape;
  shape.num_tokens = static_cast<int64_t>(b.token_ids.size());
  shape.num_seqs = num_seqs;
  shape.max_blocks_per_seq = b.max_blocks_per_seq;
  shape.num_rows = static_cast<int64_t>(b.sample_rows.size());
  shape.calibrates = std::any_of(b.calibrate.begin(), b.calibrate.end(), [](uint8_t f) { return f != 0; });
  shape.track_counts = !counts.empty();
  if (options_.window.enabled()) {
    for (int32_t s = 0; s < num_seqs; ++s) {  // kv_spill's grid bound
      const int32_t before = b.context_lens[s] - (b.query_start_loc[s + 1] - b.query_start_loc[s]);
      shape.max_spill_tokens = std::max(shape.max_spill_tokens, std::min(b.fp8_lens[s], before) - b.spill_starts[s]);
    }
  }
  if (!b.score_rows.empty() && !score) throw std::invalid_argument("Transformer::forward: score_rows without a ScoreFn");
  if (options_.graphs != TransformerOptions::Graphs::off && b.score_rows.empty()) {
    const int32_t max_blocks = (options_.max_model_len + options_.block_size - 1) / options_.block_size;
    if (const auto key = graph_key(b, graph_buckets_, max_blocks, shape.max_spill_tokens, options_.block_size)) {
      forward_graphed(b, key->num_seqs, key->width, logits, counts);
      return;
    }
  }
  const StepLayout layout = step_layout(b.token_ids.size(), b.context_lens.size(),
                                        static_cast<std::size_t>(b.max_blocks_per_seq), b.score_rows.size());
  upload_batch(b, layout, shape.track_counts);
  enqueue(layout, shape);
  finish(b, layout, shape, logits, counts);
  if (!b.score_rows.empty()) score_rows(b, layout, score);
}

void Transformer::score_rows(const ForwardBatch& b, const StepLayout& layout, const ScoreFn& score) {
  const auto vocab = static_cast<std::size_t>(config_.vocab_size);
  const auto group = static_cast<int64_t>(options_.max_num_seqs);
  score_logits_.resize(static_cast<std::size_t>(group) * vocab);
  const auto* rows = reinterpret_cast<const int32_t*>(static_cast<char*>(step_meta_.data()) + layout.score_rows);
  const auto num_rows = static_cast<int64_t>(b.score_rows.size());
  for (int64_t first = 0; first < num_rows; first += group) {
    const int64_t n = std::min(group, num_rows - first);
    enqueue_head(rows + first, n, static_cast<int64_t>(b.token_ids.size()));
    const std::span<float> out(score_logits_.data(), static_cast<std::size_t>(n) * vocab);
    backend_.copy_to_host(out.data(), logits_.data(), out.size_bytes(), stream_);
    backend_.synchronize(stream_);
    score(first, n, out);
  }
}

int Transformer::capture_decode_graphs() {
  if (options_.graphs != TransformerOptions::Graphs::on) return 0;
  // graph_key's widths: the powers of two below the widest table, and the widest.
  const int32_t max_blocks = (options_.max_model_len + options_.block_size - 1) / options_.block_size;
  std::vector<int32_t> widths;
  for (int32_t w = 1; w < max_blocks; w *= 2) widths.push_back(w);
  widths.push_back(max_blocks);
  const uint64_t before = graphs_captured_;
  for (const int32_t bucket : graph_buckets_) {
    for (const int32_t width : widths) {
      if (graphs_.count({bucket, width}) != 0) continue;
      // Padding sequences only, shaped as a real decode step of this key is (the window's arrays
      // included), so the captured launches are the ones a real step replays.
      HostBatch padding = pad_decode(ForwardBatch{}, GraphKey{bucket, width}, config_.num_layers);
      if (options_.window.enabled()) {
        padding.fp8_lens.assign(static_cast<std::size_t>(bucket), 1);
        padding.spill_starts.assign(static_cast<std::size_t>(bucket), 1);
        padding.tail_slots.assign(static_cast<std::size_t>(bucket), 0);
      }
      forward_graphed(padding.view(), bucket, width, {}, {});
    }
  }
  return static_cast<int>(graphs_captured_ - before);
}

void Transformer::forward_graphed(const ForwardBatch& b, int32_t num_seqs, int32_t width, std::span<float> logits,
                                  std::span<KvWriteCounts> counts) {
  HostBatch padded = pad_decode(b, GraphKey{num_seqs, width}, config_.num_layers);
  const ForwardBatch p = padded.view();
  StepShape shape;
  shape.num_tokens = num_seqs;
  shape.num_seqs = num_seqs;
  shape.max_blocks_per_seq = width;
  shape.num_rows = num_seqs;
  // The same launches for every step of the bucket: kv_spill always, with the most a step that
  // graph_key admits can spill (nothing to do for most sequences), counts always.
  shape.max_spill_tokens = options_.window.enabled() ? options_.block_size : 0;
  shape.track_counts = true;
  const StepLayout layout = step_layout(static_cast<std::size_t>(num_seqs), static_cast<std::size_t>(num_seqs),
                                        static_cast<std::size_t>(width));
  upload_batch(p, layout, true);
  if (options_.graphs == TransformerOptions::Graphs::padded) {
    enqueue(layout, shape);
  } else if (const auto it = graphs_.find({num_seqs, width}); it != graphs_.end()) {
    backend_.replay(*it->second, stream_);
    ++graph_replays_;
  } else {
    // Op by op first: that runs this step and grows every workspace to the bucket's size, so
    // the capture (which runs nothing) sees the buffers the replays will use.
    enqueue(layout, shape);
    backend_.begin_capture(stream_);
    try {
      enqueue(layout, shape);
    } catch (...) {
      try {
        (void)backend_.end_capture(stream_);
      } catch (...) {
      }
      throw;
    }
    graphs_.emplace(std::pair{num_seqs, width}, backend_.end_capture(stream_));
    ++graphs_captured_;
  }
  finish(p, layout, shape, logits, counts);
}

void Transformer::enqueue(const StepLayout& layout, const StepShape& shape) {
  const ModelConfig& c = config_;
  const int64_t num_tokens = shape.num_tokens;
  const int32_t num_seqs = shape.num_seqs;
  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t q_width = c.num_heads * head_dim;
  const int64_t kv_width = c.num_kv_heads * head_dim;
  const int64_t qkv_width = q_width + 2 * kv_width;
  const int64_t inter = c.intermediate_size;

  // Activation pointers; `at` offsets one by a number of elements of the activation dtype.
  auto at = [this](const DeviceBuffer& buffer, int64_t elements) {
    return static_cast<char*>(buffer.data()) + elements * static_cast<int64_t>(act_bytes_);
  };
  void* x = hidden_.data();        // [num_tokens, hidden] residual stream
  void* normed = normed_.data();   // [num_tokens, hidden]
  void* qkv = qkv_.data();         // [num_tokens, qkv_width]: q | k | v per row
  void* q = qkv;                   // [num_tokens, num_heads, head_dim] (row stride qkv_width)
  void* k = at(qkv_, q_width);     // [num_tokens, num_kv_heads, head_dim]
  void* v = at(qkv_, q_width + kv_width);  // [num_tokens, num_kv_heads, head_dim]
  void* attn = attn_out_.data();   // [num_tokens, num_heads, head_dim]
  void* proj = proj_out_.data();   // [num_tokens, hidden]
  void* gate = gate_up_.data();    // [num_tokens, intermediate] (row stride 2 * intermediate)
  void* up = at(gate_up_, inter);  // [num_tokens, intermediate]

  // Step metadata on the device (StepLayout).
  auto meta = [this](std::size_t offset) { return static_cast<char*>(step_meta_.data()) + offset; };
  const auto* token_ids = reinterpret_cast<const int32_t*>(meta(layout.token_ids));
  const auto* positions = reinterpret_cast<const int32_t*>(meta(layout.positions));
  auto* k_scales = reinterpret_cast<float*>(meta(layout.k_scales));
  auto* v_scales = reinterpret_cast<float*>(meta(layout.v_scales));
  auto* step_counts = reinterpret_cast<KvWriteCounts*>(meta(layout.counts));
  PagedBatch batch;
  batch.num_seqs = num_seqs;
  batch.num_tokens = static_cast<int32_t>(num_tokens);
  batch.query_start_loc = reinterpret_cast<const int32_t*>(meta(layout.query_start_loc));
  batch.context_lens = reinterpret_cast<const int32_t*>(meta(layout.context_lens));
  batch.block_tables = reinterpret_cast<const int32_t*>(meta(layout.block_tables));
  batch.max_blocks_per_seq = shape.max_blocks_per_seq;
  batch.slot_mapping = reinterpret_cast<const int64_t*>(meta(layout.slot_mapping));
  // Null when no sequence calibrates: a device backend then skips kv_write's amax pass.
  batch.calibrate = shape.calibrates ? reinterpret_cast<const uint8_t*>(meta(layout.calibrate)) : nullptr;
  if (options_.window.enabled()) {
    batch.fp8_lens = reinterpret_cast<const int32_t*>(meta(layout.fp8_lens));
    batch.tail_slots = reinterpret_cast<const int32_t*>(meta(layout.tail_slots));
    batch.tail_ring_blocks = options_.window.ring_blocks();
  }
  const int32_t max_spill_tokens = shape.max_spill_tokens;
  const bool track_counts = shape.track_counts;

  auto linear = [&](const void* in, int64_t in_stride, const DeviceProjection& w, const std::uint16_t* bias,
                    void* out, int64_t out_stride) {
    LinearParams p;
    p.x = in;
    p.x_stride = in_stride;
    p.weight = w.weight;
    p.weight_dtype = w.dtype;
    p.weight_scales = w.scales;
    p.weight_block_k = w.block_k;
    p.bias = bias;
    p.y = out;
    p.y_stride = out_stride;
    p.num_tokens = num_tokens;
    p.in_features = w.in_features;
    p.out_features = w.out_features;
    backend_.linear(p, stream_);
  };
  // residual != nullptr: residual += in, then out = norm(residual) (the fused residual add).
  auto rms_norm = [&](const void* in, void* out, const std::uint16_t* weight, int64_t num_heads,
                      int64_t dim, int64_t token_stride, void* residual = nullptr) {
    RmsNormParams p;
    p.x = in;
    p.out = out;
    p.residual = residual;
    p.weight = weight;
    p.num_tokens = num_tokens;
    p.num_heads = num_heads;
    p.dim = dim;
    p.x_token_stride = token_stride;
    p.out_token_stride = token_stride;
    p.eps = c.rms_norm_eps;
    backend_.rms_norm(p, stream_);
  };

  EmbeddingParams embed;
  embed.table = embed_tokens_;
  embed.token_ids = token_ids;
  embed.out = x;
  embed.num_tokens = num_tokens;
  embed.vocab_size = c.vocab_size;
  embed.hidden = hidden;
  backend_.embedding(embed, stream_);

  // Each block's output (proj) joins the residual stream x inside the next norm.
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = layers_[static_cast<std::size_t>(layer)];
    batch.k_scales = k_scales + static_cast<int64_t>(layer) * num_seqs;
    batch.v_scales = v_scales + static_cast<int64_t>(layer) * num_seqs;

    // Attention block: (x += previous MLP) norm -> q, k, v -> (q/k norm) -> rope -> kv_write ->
    // attention -> o_proj.
    rms_norm(layer == 0 ? x : proj, normed, w.input_norm, 1, hidden, hidden, layer == 0 ? nullptr : x);
    linear(normed, hidden, w.qkv_proj, w.qkv_bias, qkv, qkv_width);
    if (c.qk_norm) {
      rms_norm(q, q, w.q_norm, c.num_heads, head_dim, qkv_width);
      rms_norm(k, k, w.k_norm, c.num_kv_heads, head_dim, qkv_width);
    }
    RopeParams rope;
    rope.q = q;
    rope.k = k;
    rope.positions = positions;
    rope.num_tokens = num_tokens;
    rope.num_q_heads = c.num_heads;
    rope.num_kv_heads = c.num_kv_heads;
    rope.head_dim = head_dim;
    rope.q_token_stride = qkv_width;
    rope.k_token_stride = qkv_width;
    backend_.rope(rope, stream_);

    const PagedKvView tail = options_.window.enabled() ? tail_views_[static_cast<std::size_t>(layer)] : PagedKvView{};
    if (max_spill_tokens > 0) {  // blocks leave the window: into FP8 before kv_write reuses their ring slots
      KvSpillParams spill;
      spill.cache = kv_views_[static_cast<std::size_t>(layer)];
      spill.tail = tail;
      spill.batch = batch;
      spill.spill_starts = reinterpret_cast<const int32_t*>(meta(layout.spill_starts));
      spill.max_spill_tokens = max_spill_tokens;
      spill.counts = track_counts ? step_counts + layer : nullptr;
      backend_.kv_spill(spill, stream_);
    }

    KvWriteParams write;
    write.k = k;
    write.v = v;
    write.k_token_stride = qkv_width;
    write.v_token_stride = qkv_width;
    write.cache = kv_views_[static_cast<std::size_t>(layer)];
    write.tail = tail;
    write.batch = batch;
    write.scale_margin = options_.kv_scale_margin;
    write.counts = track_counts ? step_counts + layer : nullptr;
    backend_.kv_write(write, stream_);

    PagedAttentionParams attention;
    attention.q = q;
    attention.q_token_stride = qkv_width;
    attention.out = attn;
    attention.out_token_stride = q_width;
    attention.num_heads = c.num_heads;
    attention.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    attention.cache = kv_views_[static_cast<std::size_t>(layer)];
    attention.tail = tail;
    attention.batch = batch;
    backend_.paged_attention(attention, stream_);

    linear(attn, q_width, w.o_proj, nullptr, proj, hidden);

    // MLP block: (x += attention) norm -> gate, up -> silu(gate) * up -> down_proj.
    rms_norm(proj, normed, w.post_norm, 1, hidden, hidden, x);
    linear(normed, hidden, w.gate_up_proj, nullptr, gate, 2 * inter);
    SiluMulParams swiglu;
    swiglu.gate = gate;
    swiglu.up = up;
    swiglu.out = gate;
    swiglu.num_tokens = num_tokens;
    swiglu.dim = inter;
    swiglu.gate_token_stride = 2 * inter;
    swiglu.up_token_stride = 2 * inter;
    swiglu.out_token_stride = 2 * inter;
    backend_.silu_mul(swiglu, stream_);
    linear(gate, 2 * inter, w.down_proj, nullptr, proj, hidden);
  }

  // Logits only for the rows that sample.
  if (shape.num_rows > 0) enqueue_head(reinterpret_cast<const int32_t*>(meta(layout.sample_rows)), shape.num_rows, num_tokens);
}

// Gather the stream and the last MLP output at `rows`, add them inside the final norm, LM head.
void Transformer::enqueue_head(const int32_t* rows, int64_t num_rows, int64_t num_tokens) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  GatherRowsParams gather;
  gather.x = hidden_.data();
  gather.rows = rows;
  gather.out = sampled_.data();
  gather.num_x_rows = num_tokens;
  gather.num_rows = num_rows;
  gather.dim = hidden;
  backend_.gather_rows(gather, stream_);
  gather.x = proj_out_.data();
  gather.out = sampled_delta_.data();
  backend_.gather_rows(gather, stream_);

  RmsNormParams norm;
  norm.x = sampled_delta_.data();
  norm.residual = sampled_.data();
  norm.out = sampled_.data();
  norm.weight = final_norm_;
  norm.num_tokens = num_rows;
  norm.dim = hidden;
  norm.eps = c.rms_norm_eps;
  backend_.rms_norm(norm, stream_);

  LinearParams head;
  head.x = sampled_.data();
  head.weight = lm_head_.weight;
  head.weight_dtype = lm_head_.dtype;
  head.weight_scales = lm_head_.scales;
  head.weight_block_k = lm_head_.block_k;
  head.y = logits_.data();
  head.num_tokens = num_rows;
  head.in_features = hidden;
  head.out_features = c.vocab_size;
  head.y_fp32 = true;
  backend_.linear(head, stream_);
}

void Transformer::finish(const ForwardBatch& b, const StepLayout& layout, const StepShape& shape,
                         std::span<float> logits, std::span<KvWriteCounts> counts) {
  if (!logits.empty()) backend_.copy_to_host(logits.data(), logits_.data(), logits.size_bytes(), stream_);
  // Scales (when some were calibrated) and counts come back in one copy; they land in
  // step_host_ once the stream is synchronized.
  auto* meta = static_cast<char*>(step_meta_.data());
  const std::size_t back_begin = shape.calibrates ? layout.k_scales : layout.counts;
  const std::size_t back_end = shape.track_counts ? layout.end : layout.counts;
  if (back_end > back_begin) {
    backend_.copy_to_host(step_host_.data() + back_begin, meta + back_begin, back_end - back_begin, stream_);
  }
  backend_.synchronize(stream_);
  if (shape.calibrates) {
    std::memcpy(b.k_scales.data(), step_host_.data() + layout.k_scales, b.k_scales.size_bytes());
    std::memcpy(b.v_scales.data(), step_host_.data() + layout.v_scales, b.v_scales.size_bytes());
  }
  if (!counts.empty()) {
    std::vector<KvWriteCounts> step(counts.size());
    std::memcpy(step.data(), step_host_.data() + layout.counts, counts.size_bytes());
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += step[i];
  }
}

void Transformer::copy_blocks(std::span<const BlockCopy> copies) {
  std::vector<int32_t> src, dst;
  for (const BlockCopy& copy : copies) {
    src.push_back(copy.src);
    dst.push_back(copy.dst);
  }
  copy_pool_blocks(backend_, stream_, kv_views_, src, dst);
}

void Transformer::copy_tail_rings(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  if (tail_views_.empty()) throw std::logic_error("Transformer::copy_tail_rings without a bf16 window");
  const int32_t ring = options_.window.ring_blocks();
  std::vector<int32_t> src, dst;
  for (const BlockCopy& copy : copies) {
    for (int32_t b = 0; b < ring; ++b) {
      src.push_back(copy.src * ring + b);
      dst.push_back(copy.dst * ring + b);
    }
  }
  copy_pool_blocks(backend_, stream_, tail_views_, src, dst);
}

}  // namespace fp8serve
