#pragma once
// Contract checks shared by the CPU kv_write and paged attention. They run on every call: the
// cost is one pass over the batch's block-table entries, tiny next to the attention itself, and
// in exchange a broken block table or slot is an exception with a message, never a read or a
// write outside the pool.
#include "kernels/paged_kv.hpp"

namespace fp8serve::cpu {

// Geometry and pointers of the view (head_dim limited by the kernels' stack buffers). A null V
// is allowed only where `v_optional` (a K-only tail pool).
void validate_paged_kv_view(const PagedKvView& view, bool v_optional = false);

// query_start_loc starts at 0, never decreases and ends at num_tokens.
void validate_query_starts(const PagedBatch& batch);

// Every sequence: 0 < context_len, new tokens <= context_len, its blocks fit max_blocks_per_seq
// and every block id it uses is in [0, num_blocks).
void validate_block_tables(const PagedBatch& batch, const PagedKvView& view);

// FP8 pool: the scales the sequences read are finite and > 0.
void validate_scales(const PagedBatch& batch, const PagedKvView& view);

// The bf16 window's fields, when batch.has_tail(): the main pool is FP8; the tail a bf16 view
// of the same geometry (V may be null: K only); tail_slots and tail_ring_blocks positive and
// every ring inside the tail pool; 0 <= fp8_lens <= context_lens with the tail part fitting its
// ring (context_lens - fp8_lens <= tail_ring_blocks * block_size). No-op without a tail.
void validate_tail(const PagedBatch& batch, const PagedKvView& cache, const PagedKvView& tail);

}  // namespace fp8serve::cpu
