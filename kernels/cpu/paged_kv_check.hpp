#pragma once
// Contract checks shared by the CPU kv_write and paged attention. They run on every call: the
// cost is one pass over the batch's block-table entries, tiny next to the attention itself, and
// in exchange a broken block table or slot is an exception with a message, never a read or a
// write outside the pool.
#include "kernels/paged_kv.hpp"

namespace fp8serve::cpu {

// Geometry and pointers of the view (head_dim limited by the kernels' stack buffers).
void validate_paged_kv_view(const PagedKvView& view);

// query_start_loc starts at 0, never decreases and ends at num_tokens.
void validate_query_starts(const PagedBatch& batch);

// Every sequence: 0 < context_len, new tokens <= context_len, its blocks fit max_blocks_per_seq
// and every block id it uses is in [0, num_blocks).
void validate_block_tables(const PagedBatch& batch, const PagedKvView& view);

// FP8 pool: the scales the sequences read are finite and > 0.
void validate_scales(const PagedBatch& batch, const PagedKvView& view);

}  // namespace fp8serve::cpu
