#pragma once
// kv_write: store a step's new K and V (after RoPE) into their slots of one layer's pool.
//
// FP8 pool: q = fp8_e4m3_encode(x / scale) with the sequence's frozen per-tensor scale of this
// layer. A sequence in its first prefill chunk (batch.calibrate[s] != 0) first calibrates:
// amax over that chunk's K of this layer (all KV heads), scale = calibrate_kv_scale(amax,
// scale_margin) written to batch.k_scales[s] (likewise V), then quantizes with it. Elements
// with |x / scale| > 448 saturate to ±448 and are counted. bf16 pool: round to nearest even,
// no scale, nothing counted as saturated.
#include <cstdint>

#include "cache/kv_scales.hpp"
#include "kernels/paged_kv.hpp"

namespace fp8serve {

struct KvWriteParams {
  const void* k = nullptr;   // [num_tokens, num_kv_heads, head_dim] activation dtype (fp32 on CPU)
  const void* v = nullptr;   // [num_tokens, num_kv_heads, head_dim]
  int64_t k_token_stride = 0;  // elements between tokens; 0 = num_kv_heads * head_dim (packed)
  int64_t v_token_stride = 0;  // likewise
  PagedKvView cache;
  PagedKvView tail;  // bf16 tail pool of this layer; used only when batch.has_tail()
  PagedBatch batch;  // uses query_start_loc, slot_mapping, scales, context_lens and the tail fields
  float scale_margin = kDefaultKvScaleMargin;     // PRECOND: validate_kv_scale_margin passed
  KvWriteCounts* counts = nullptr;                // optional, accumulated (+=) for this layer
};

}  // namespace fp8serve
