#include "model/transformer.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"  // rope_inv_freq: host-side math shared by every backend

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
  sampled_ = activations(seqs * hidden);
  logits_ = device_array<float>(backend_, seqs * static_cast<std::size_t>(c.vocab_size));

  const auto max_blocks = static_cast<std::size_t>((options.max_model_len + options.block_size - 1) /
                                                   options.block_size);
  const auto layers = static_cast<std::size_t>(c.num_layers);
  token_ids_ = device_array<int32_t>(backend_, rows);
  positions_ = device_array<int32_t>(backend_, rows);
  slot_mapping_ = device_array<int64_t>(backend_, rows);
  query_start_loc_ = device_array<int32_t>(backend_, seqs + 1);
  context_lens_ = device_array<int32_t>(backend_, seqs);
  block_tables_ = device_array<int32_t>(backend_, seqs * max_blocks);
  k_scales_ = device_array<float>(backend_, layers * seqs);
  v_scales_ = device_array<float>(backend_, layers * seqs);
  calibrate_ = device_array<uint8_t>(backend_, seqs);
  sample_rows_ = device_array<int32_t>(backend_, seqs);
  counts_ = device_array<KvWriteCounts>(backend_, layers);

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

void Transformer::allocate_kv_cache(int num_blocks) {
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
}

std::string Transformer::describe_weights() const {
  auto mib = [](uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(buf);
  };
  const WeightBytes& b = weight_bytes_;
  std::string out = mib(b.total());
  if (b.fp8 == 0) return out + " bf16";
  return out + ": FP8 projections " + mib(b.fp8) + " + scales " + mib(b.fp8_scales) + " (bf16 would be " +
         mib(b.fp8_as_bf16) + "), bf16 " + mib(b.bf16) + std::string(lm_head_.dtype == WeightDtype::fp8_e4m3
                                                                           ? " (embeddings, norms; LM head FP8)"
                                                                           : " (embeddings, norms, LM head)");
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
  if (b.sample_rows.size() > static_cast<std::size_t>(options_.max_num_seqs))
    fail("more sample rows than max_num_seqs");
  if (logits.size() != b.sample_rows.size() * static_cast<std::size_t>(config_.vocab_size))
    fail("logits must be [sample_rows, vocab_size]");
  for (const int64_t s : b.slot_mapping)
    if (s >= static_cast<int64_t>(options_.num_blocks) * options_.block_size) fail("slot outside the pool");
  for (const int32_t p : b.positions)
    if (p < 0 || p >= options_.max_model_len) fail("position outside [0, max_model_len)");
}

void Transformer::upload_batch(const ForwardBatch& b) {
  auto put = [&](const DeviceBuffer& dst, auto span) {
    backend_.copy_to_device(dst.data(), span.data(), span.size_bytes(), stream_);
  };
  put(token_ids_, b.token_ids);
  put(positions_, b.positions);
  put(query_start_loc_, b.query_start_loc);
  put(context_lens_, b.context_lens);
  put(block_tables_, b.block_tables);
  put(slot_mapping_, b.slot_mapping);
  put(k_scales_, b.k_scales);
  put(v_scales_, b.v_scales);
  put(calibrate_, b.calibrate);
  put(sample_rows_, b.sample_rows);
}

void Transformer::forward(const ForwardBatch& b, std::span<float> logits, std::span<KvWriteCounts> counts) {
  if (!has_kv_cache()) throw std::logic_error("Transformer::forward: allocate_kv_cache() was not called");
  validate(b, logits);
  upload_batch(b);
  const ModelConfig& c = config_;
  const int64_t num_tokens = static_cast<int64_t>(b.token_ids.size());
  const int32_t num_seqs = static_cast<int32_t>(b.context_lens.size());
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

  const bool track_counts = !counts.empty();
  if (track_counts) {
    if (counts.size() != static_cast<std::size_t>(c.num_layers))
      throw std::invalid_argument("Transformer::forward: counts must be [num_layers]");
    const std::vector<KvWriteCounts> zeros(counts.size());
    backend_.copy_to_device(counts_.data(), zeros.data(), counts.size_bytes(), stream_);
  }

  PagedBatch batch;
  batch.num_seqs = num_seqs;
  batch.num_tokens = static_cast<int32_t>(num_tokens);
  batch.query_start_loc = query_start_loc_.as<const int32_t>();
  batch.context_lens = context_lens_.as<const int32_t>();
  batch.block_tables = block_tables_.as<const int32_t>();
  batch.max_blocks_per_seq = b.max_blocks_per_seq;
  batch.slot_mapping = slot_mapping_.as<const int64_t>();
  batch.calibrate = calibrate_.as<const uint8_t>();

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
  auto rms_norm = [&](const void* in, void* out, const std::uint16_t* weight, int64_t num_heads,
                      int64_t dim, int64_t token_stride) {
    RmsNormParams p;
    p.x = in;
    p.out = out;
    p.weight = weight;
    p.num_tokens = num_tokens;
    p.num_heads = num_heads;
    p.dim = dim;
    p.x_token_stride = token_stride;
    p.out_token_stride = token_stride;
    p.eps = c.rms_norm_eps;
    backend_.rms_norm(p, stream_);
  };
  auto residual_add = [&](const void* delta) {
    ResidualAddParams p;
    p.residual = x;
    p.x = delta;
    p.num_elements = num_tokens * hidden;
    backend_.residual_add(p, stream_);
  };

  EmbeddingParams embed;
  embed.table = embed_tokens_;
  embed.token_ids = token_ids_.as<const int32_t>();
  embed.out = x;
  embed.num_tokens = num_tokens;
  embed.vocab_size = c.vocab_size;
  embed.hidden = hidden;
  backend_.embedding(embed, stream_);

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = layers_[static_cast<std::size_t>(layer)];
    batch.k_scales = k_scales_.as<float>() + static_cast<int64_t>(layer) * num_seqs;
    batch.v_scales = v_scales_.as<float>() + static_cast<int64_t>(layer) * num_seqs;

    // Attention block: norm -> q, k, v -> (q/k norm) -> rope -> kv_write -> attention -> o_proj.
    rms_norm(x, normed, w.input_norm, 1, hidden, hidden);
    linear(normed, hidden, w.qkv_proj, w.qkv_bias, qkv, qkv_width);
    if (c.qk_norm) {
      rms_norm(q, q, w.q_norm, c.num_heads, head_dim, qkv_width);
      rms_norm(k, k, w.k_norm, c.num_kv_heads, head_dim, qkv_width);
    }
    RopeParams rope;
    rope.q = q;
    rope.k = k;
    rope.positions = positions_.as<const int32_t>();
    rope.num_tokens = num_tokens;
    rope.num_q_heads = c.num_heads;
    rope.num_kv_heads = c.num_kv_heads;
    rope.head_dim = head_dim;
    rope.q_token_stride = qkv_width;
    rope.k_token_stride = qkv_width;
    backend_.rope(rope, stream_);

    KvWriteParams write;
    write.k = k;
    write.v = v;
    write.k_token_stride = qkv_width;
    write.v_token_stride = qkv_width;
    write.cache = kv_views_[static_cast<std::size_t>(layer)];
    write.batch = batch;
    write.scale_margin = options_.kv_scale_margin;
    write.counts = track_counts ? counts_.as<KvWriteCounts>() + layer : nullptr;
    backend_.kv_write(write, stream_);

    PagedAttentionParams attention;
    attention.q = q;
    attention.q_token_stride = qkv_width;
    attention.out = attn;
    attention.out_token_stride = q_width;
    attention.num_heads = c.num_heads;
    attention.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    attention.cache = kv_views_[static_cast<std::size_t>(layer)];
    attention.batch = batch;
    backend_.paged_attention(attention, stream_);

    linear(attn, q_width, w.o_proj, nullptr, proj, hidden);
    residual_add(proj);

    // MLP block: norm -> gate, up -> silu(gate) * up -> down_proj.
    rms_norm(x, normed, w.post_norm, 1, hidden, hidden);
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
    residual_add(proj);
  }

  // Logits only for the rows that sample: gather, final norm, LM head.
  const auto num_rows = static_cast<int64_t>(b.sample_rows.size());
  if (num_rows > 0) {
    GatherRowsParams gather;
    gather.x = x;
    gather.rows = sample_rows_.as<const int32_t>();
    gather.out = sampled_.data();
    gather.num_x_rows = num_tokens;
    gather.num_rows = num_rows;
    gather.dim = hidden;
    backend_.gather_rows(gather, stream_);

    RmsNormParams norm;
    norm.x = sampled_.data();
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
    backend_.copy_to_host(logits.data(), logits_.data(), logits.size_bytes(), stream_);
  }
  backend_.copy_to_host(b.k_scales.data(), k_scales_.data(), b.k_scales.size_bytes(), stream_);
  backend_.copy_to_host(b.v_scales.data(), v_scales_.data(), b.v_scales.size_bytes(), stream_);
  if (track_counts) {
    std::vector<KvWriteCounts> step(counts.size());
    backend_.copy_to_host(step.data(), counts_.data(), counts.size_bytes(), stream_);
    for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += step[i];
  }
  backend_.synchronize(stream_);
}

void Transformer::copy_blocks(std::span<const BlockCopy> copies) {
  if (copies.empty()) return;
  std::vector<int32_t> src, dst;
  for (const BlockCopy& copy : copies) {
    src.push_back(copy.src);
    dst.push_back(copy.dst);
  }
  CopyBlocksParams p;
  p.layers = kv_views_.data();
  p.num_layers = static_cast<int32_t>(kv_views_.size());
  p.src = src.data();
  p.dst = dst.data();
  p.num_copies = static_cast<int32_t>(copies.size());
  backend_.copy_blocks(p, stream_);
}

}  // namespace fp8serve
