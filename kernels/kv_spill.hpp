#pragma once
// kv_spill: the positions that leave a sequence's bf16 recent window this step move from the
// tail into their FP8 slots (the contract of the window is in kernels/paged_kv.hpp). Runs once
// per layer, before that layer's kv_write, which may reuse the ring slots it frees.
//
// For every sequence s, the positions
//     p in [spill_starts[s], min(batch.fp8_lens[s], batch.context_lens[s] - num_new(s)))
// (the sequence's fp8_len before this step up to its fp8_len after it, capped at the context
// the earlier steps wrote: new tokens below fp8_lens are kv_write's) hold bf16 values in the
// tail at batch.tail_slot(s, p), written by earlier steps. Each K row (and V row, unless
// tail.v == nullptr) of each KV head is quantized with the sequence's frozen scale of this
// layer, q = fp8_e4m3_encode(bf16_decode(tail) / batch.k_scales[s]) (v_scales for V), into
// the FP8 slot block_table(s)[p / B] * B + p % B; elements with |tail / scale| > 464 are
// counted as saturated, exactly as kv_write counts them. The tail is only read. An empty range
// (the usual decode step: a block leaves the window once every B steps) does nothing; a
// calibrating sequence (calibrate[s] != 0, its first chunk) never has one.
//
// One fused pass: read bf16, divide, encode, count. On the GPU the grid can span the batch's
// sequences and max_spill_tokens positions; the CPU splits over (sequence, position).
#include <cstdint>

#include "kernels/kv_scale_math.hpp"
#include "kernels/paged_kv.hpp"

namespace fp8serve {

struct KvSpillParams {
  PagedKvView cache;  // the layer's FP8 pool
  PagedKvView tail;   // the layer's bf16 tail pool (v == nullptr: a K-only window)
  PagedBatch batch;   // uses query_start_loc, context_lens, block_tables, scales, the tail fields
  const int32_t* spill_starts = nullptr;  // [num_seqs] each sequence's fp8_len before this step
  int32_t max_spill_tokens = 0;  // >= every sequence's range length; 0: nothing to spill
  KvWriteCounts* counts = nullptr;  // optional, accumulated (+=) for this layer
};

}  // namespace fp8serve
