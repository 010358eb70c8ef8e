// Setting the Transformer up, once: the options' checks, the weights' upload (q/k/v and gate/up
// fused), the rope table, the activation and metadata buffers sized for the largest step, and the
// start-up log's description of the weights.
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"  // rope_inv_freq: host-side math shared by every backend
#include "model/decode_graphs.hpp"
#include "model/transformer.hpp"

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
  if (options.kv_rotation != KvRotation::none && options.kv_dtype != KvDtype::fp8_e4m3) {
    throw std::invalid_argument("Transformer: --kv-rotation applies to the FP8 pool only");
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
  logits_ = DeviceBuffer(backend_, std::max(seqs, sampled_rows) * static_cast<std::size_t>(c.vocab_size) * sizeof(float));

  const std::size_t meta_bytes = step_layout(rows, seqs, static_cast<std::size_t>(max_table_blocks()), rows).end;
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

}  // namespace fp8serve
