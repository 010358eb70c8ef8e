#pragma once
// paged_attention: softmax(q k^T * softmax_scale) v for every query token of a flattened batch,
// reading K and V from one layer's paged pool. Prefill chunks attend causally to their cached
// context plus the chunk (the chunk's K/V are written by kv_write first); decode tokens are
// chunks of one. GQA: query head h reads KV head h / (num_heads / num_kv_heads).
//
// FP8 pool: K and V are read as FP8 and converted in registers; the K scale is folded into the
// softmax scale (q·(k_scale k̂) * s = (q·k̂) * (s * k_scale)) and the V scale into the output
// (Σ p (v_scale v̂) = v_scale Σ p v̂). No dequantized copy of the cache is ever made.
//
// The bf16 recent window (batch.has_tail(); kernels/paged_kv.hpp): keys and values at positions
// below fp8_lens[s] are read from the FP8 pool as above, those from fp8_lens[s] on from the
// sequence's tail ring, bf16 and exact: no k_scale on their scores (q·k * softmax_scale), no
// v_scale on their values (K only, with V from the FP8 pool, in a K-only window). One pass:
// both segments feed the same online softmax (running max, running sum, running output), so the
// result is softmax over the whole context, not a merge of two attentions; split-K partitions
// may straddle the boundary and merge as usual. The V scale is folded per segment: the CPU keeps
// the FP8 body's sum Σ p v̂ apart until the tail begins, then multiplies it by v_scale once and
// adds the tail's Σ p v (a GPU kernel may scale each FP8 key's p by v_scale instead); either
// way no dequantized copy of the FP8 part is made.
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
