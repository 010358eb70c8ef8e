// The forward pass: embed, then one loop over the layers (norm -> qkv -> rope -> kv write ->
// attention -> out proj -> residual -> norm -> mlp -> residual), then the LM head on the rows
// that sample. forward() checks and uploads the step, enqueue() issues its ops,
// finish() brings the results back (transformer_step.cpp).
#include "model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/decode_graphs.hpp"

namespace fp8serve {

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
    if (const auto key = graph_key(b, graph_buckets_, max_table_blocks(), shape.max_spill_tokens, options_.block_size)) {
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

  // The step's ops, each a backend call over these buffers (kernels/forward_ops.hpp).
  auto embed = [&] {
    EmbeddingParams p;
    p.table = embed_tokens_;
    p.token_ids = token_ids;
    p.out = x;
    p.num_tokens = num_tokens;
    p.vocab_size = c.vocab_size;
    p.hidden = hidden;
    backend_.embedding(p, stream_);
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
  auto rope = [&](int64_t rotate_heads) {  // q and k in place (then, rotating, q | k (| v))
    RopeParams p;
    p.q = q;
    p.k = k;
    p.positions = positions;
    p.num_tokens = num_tokens;
    p.num_q_heads = c.num_heads;
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = head_dim;
    p.q_token_stride = qkv_width;
    p.k_token_stride = qkv_width;
    p.rotate_heads = rotate_heads;
    backend_.rope(p, stream_);
  };
  // --kv-rotation: q | k (| v) of each row in one pass with RoPE - they are contiguous - and the
  // attention output back through the same (self-inverse) transform.
  const bool rotate = options_.kv_rotation == KvRotation::hadamard;
  auto hadamard = [&](void* at, int64_t num_heads, int64_t token_stride) {
    HeadHadamardParams p;
    p.x = at;
    p.num_tokens = num_tokens;
    p.num_heads = num_heads;
    p.head_dim = head_dim;
    p.token_stride = token_stride;
    backend_.head_hadamard(p, stream_);
  };
  const int64_t rotated_heads = c.num_heads + c.num_kv_heads * (options_.rotate_values ? 2 : 1);
  // The window's tail pool of a layer; an empty view without a window.
  auto tail_of = [&](int layer) {
    return options_.window.enabled() ? tail_views_[static_cast<std::size_t>(layer)] : PagedKvView{};
  };
  // The step's k and v into the layer's pools. With the window, the blocks that leave it go to
  // FP8 first, before kv_write reuses their ring slots.
  auto kv_write = [&](int layer) {
    KvWriteCounts* layer_counts = shape.track_counts ? step_counts + layer : nullptr;
    if (shape.max_spill_tokens > 0) {
      KvSpillParams spill;
      spill.cache = kv_views_[static_cast<std::size_t>(layer)];
      spill.tail = tail_of(layer);
      spill.batch = batch;
      spill.spill_starts = reinterpret_cast<const int32_t*>(meta(layout.spill_starts));
      spill.max_spill_tokens = shape.max_spill_tokens;
      spill.counts = layer_counts;
      backend_.kv_spill(spill, stream_);
    }
    KvWriteParams p;
    p.k = k;
    p.v = v;
    p.k_token_stride = qkv_width;
    p.v_token_stride = qkv_width;
    p.cache = kv_views_[static_cast<std::size_t>(layer)];
    p.tail = tail_of(layer);
    p.batch = batch;
    p.scale_margin = options_.kv_scale_margin;
    p.counts = layer_counts;
    backend_.kv_write(p, stream_);
  };
  auto attention = [&](int layer) {  // q against the layer's pools -> attn
    PagedAttentionParams p;
    p.q = q;
    p.q_token_stride = qkv_width;
    p.out = attn;
    p.out_token_stride = q_width;
    p.num_heads = c.num_heads;
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    p.cache = kv_views_[static_cast<std::size_t>(layer)];
    p.tail = tail_of(layer);
    p.batch = batch;
    backend_.paged_attention(p, stream_);
  };
  auto silu_mul = [&] {  // gate = silu(gate) * up, in place
    SiluMulParams p;
    p.gate = gate;
    p.up = up;
    p.out = gate;
    p.num_tokens = num_tokens;
    p.dim = inter;
    p.gate_token_stride = 2 * inter;
    p.up_token_stride = 2 * inter;
    p.out_token_stride = 2 * inter;
    backend_.silu_mul(p, stream_);
  };

  // The model. Each block's output (proj) joins the residual stream x inside the next norm.
  embed();
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = layers_[static_cast<std::size_t>(layer)];
    batch.k_scales = k_scales + static_cast<int64_t>(layer) * num_seqs;
    batch.v_scales = v_scales + static_cast<int64_t>(layer) * num_seqs;

    // Attention block: (x += previous MLP) norm -> q, k, v -> (q/k norm) -> rope -> (rotation)
    // -> kv_write -> attention -> (rotation back) -> o_proj.
    rms_norm(layer == 0 ? x : proj, normed, w.input_norm, 1, hidden, hidden, layer == 0 ? nullptr : x);
    linear(normed, hidden, w.qkv_proj, w.qkv_bias, qkv, qkv_width);
    if (c.qk_norm) {
      rms_norm(q, q, w.q_norm, c.num_heads, head_dim, qkv_width);
      rms_norm(k, k, w.k_norm, c.num_kv_heads, head_dim, qkv_width);
    }
    rope(rotate ? rotated_heads : 0);
    kv_write(layer);
    attention(layer);
    if (rotate && options_.rotate_values) hadamard(attn, c.num_heads, q_width);
    linear(attn, q_width, w.o_proj, nullptr, proj, hidden);

    // MLP block: (x += attention) norm -> gate, up -> silu(gate) * up -> down_proj.
    rms_norm(proj, normed, w.post_norm, 1, hidden, hidden, x);
    linear(normed, hidden, w.gate_up_proj, nullptr, gate, 2 * inter);
    silu_mul();
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

}  // namespace fp8serve
