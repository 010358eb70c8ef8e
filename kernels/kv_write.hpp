#pragma once
// kv_write: store a step's new K and V (after RoPE) into their slots of one layer's pool.
//
// FP8 pool: q = fp8_e4m3_encode(x / scale) with the sequence's frozen per-tensor scale of this
// layer. A sequence in its first prefill chunk (batch.calibrate[s] != 0) first calibrates:
// amax over that chunk's K of this layer (all KV heads), scale = calibrate_kv_scale(amax,
// scale_margin) written to batch.k_scales[s] (likewise V), then quantizes with it. Elements
// with |x / scale| > 448 saturate to ±448 and are counted. bf16 pool: round to nearest even,
// no scale, nothing counted as saturated.
//
// With the bf16 recent window (batch.has_tail(); kernels/paged_kv.hpp has the contract): new
// token i of sequence s at position p = context_lens[s] - num_new + i goes
//   - to its FP8 slot (slot_mapping) if p < fp8_lens[s] (a prefill chunk's older part), as
//     fp8_e4m3_encode(bf16(x) / scale) - the bf16 rounding first, so the bytes equal what
//     kv_spill would write for it - and is counted;
//   - else to the tail at batch.tail_slot(s, p), as bf16(x): exact, not counted.
// A K-only window (tail.v == nullptr) sends every V row to its FP8 slot that way. Calibration
// is unchanged: the amax of all the chunk's tokens (tail-bound ones included) of x itself.
#include <cstdint>

#include "kernels/kv_scale_math.hpp"
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
  KvWriteCounts* counts = nullptr;                // optional, accumulated (+=) for this layer:
                                                  // the rows written to the main pool
};

}  // namespace fp8serve
