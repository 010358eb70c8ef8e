#pragma once
// paged_attention: softmax(q k^T * softmax_scale) v for every query token of a flattened batch,
// reading K and V from one layer's paged pool. Prefill chunks attend causally to their cached
// context plus the chunk (the chunk's K/V are written by kv_write first); decode tokens are
// chunks of one. GQA: query head h reads KV head h / (num_heads / num_kv_heads).
//
// FP8 pool: K and V are read as FP8 and converted in registers; the K scale is folded into the
// softmax scale (q·(k_scale k̂) * s = (q·k̂) * (s * k_scale)) and the V scale into the output
// (Σ p (v_scale v̂) = v_scale Σ p v̂). No dequantized copy of the cache is ever made.
#include <cstdint>

#include "kernels/paged_kv.hpp"

namespace fp8serve {

struct PagedAttentionParams {
  const void* q = nullptr;  // [num_tokens, num_heads, head_dim] activation dtype (fp32 on CPU)
  void* out = nullptr;      // [num_tokens, num_heads, head_dim]
  int64_t q_token_stride = 0;    // elements between tokens; 0 = num_heads * head_dim (packed)
  int64_t out_token_stride = 0;  // likewise
  int32_t num_heads = 0;
  float softmax_scale = 0.0f;  // usually 1 / sqrt(head_dim)
  PagedKvView cache;
  PagedKvView tail;  // bf16 tail pool of this layer; used only when batch.has_tail()
  PagedBatch batch;  // uses query_start_loc, context_lens, block_tables, scales, the tail fields
};

}  // namespace fp8serve
