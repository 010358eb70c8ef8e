#pragma once
// How a kernel sees the paged KV pool and a step's flattened batch (DESIGN.md §3, §5).
//
// Two plain structs passed by value, usable from host and device code (raw pointers and
// integers only, no std:: containers), in the spirit of flashinfer's paged_kv_t:
//   PagedKvView - one layer's K and V pool: data pointers, dtype, geometry, strides.
//   PagedBatch  - the step: which query tokens belong to which sequence, each sequence's
//                 context length and block table, the slot of every new token, and the
//                 sequence's K/V scales for this layer.
// On the CPU every pointer is host memory; a CUDA backend receives device pointers in the same
// fields. Kernel-specific inputs (queries, new K/V, outputs) live in each kernel's params struct
// (kernels/kv_write.hpp, kernels/paged_attention.hpp).
//
// Layout of one layer's pool, in elements, with P = 4 bytes / element size (4 for FP8, 2 for
// bf16) and head_dim a multiple of P:
//   K: [num_blocks, num_kv_heads, head_dim / P, block_size, P]
//   V: [num_blocks, num_kv_heads, block_size, head_dim]
// Head-major inside a block, so what decode attention reads for one (sequence, kv head) work
// item - one head's keys and values in one block - is block_size * head_dim contiguous elements
// of each (2 KiB for FP8 with block 16 x head_dim 128): one sequential stream per block that the
// hardware prefetcher (CPU) or a warp's coalesced loads (GPU) read at full bandwidth. K is stored
// token-interleaved in 4-byte groups (in the spirit of vLLM's [.., head_size / x, block_size, x]):
// one 64-byte line holds the same 4 bytes of 16 consecutive keys, so the score product q . k
// runs with keys in vector lanes and needs no reduction across lanes per key. V keeps whole
// rows: its product sums over keys, with head_dim in lanes. kv_write scatters num_kv_heads
// short rows (V) and 4-byte groups (K) per new token instead, which is cheap: it touches only
// the new tokens.
#include <cstdint>

#include "cache/kv_dtype.hpp"

#if defined(__CUDACC__)
#define PAGED_KV_HD __host__ __device__ __forceinline__
#else
#define PAGED_KV_HD inline
#endif

namespace fp8serve {

// Elements per 4-byte group of K (P above).
PAGED_KV_HD constexpr int32_t kv_k_pack(KvDtype dtype) { return dtype == KvDtype::fp8_e4m3 ? 4 : 2; }

struct PagedKvView {
  void* k = nullptr;  // [num_blocks, num_kv_heads, head_dim / P, block_size, P] elements of dtype
  void* v = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  KvDtype dtype = KvDtype::fp8_e4m3;
  int32_t num_blocks = 0;
  int32_t block_size = 0;  // tokens per block
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Strides in elements, shared by K and V. One head's K in one block is always the packed
  // [head_dim / P, block_size, P] tile (block_size * head_dim elements); a V row has head_dim
  // contiguous elements. The strides let a caller hand a view of a differently packed pool
  // without copying.
  int64_t block_stride = 0;    // between blocks
  int64_t head_stride = 0;     // between KV heads inside a block, >= block_size * head_dim
  int64_t v_token_stride = 0;  // between V rows of one head inside a block, >= head_dim

  // Element offsets of element d of (slot, kv_head) in K and of the V row of (slot, kv_head),
  // where slot = block_id * block_size + offset_in_block.
  PAGED_KV_HD int64_t k_offset(int64_t slot, int32_t kv_head, int32_t d) const {
    const int64_t block = slot / block_size;
    const int64_t in_block = slot - block * block_size;
    const int32_t pack = kv_k_pack(dtype);
    return block * block_stride + kv_head * head_stride + (d / pack) * int64_t{block_size} * pack +
           in_block * pack + d % pack;
  }
  PAGED_KV_HD int64_t v_offset(int64_t slot, int32_t kv_head) const {
    const int64_t block = slot / block_size;
    const int64_t in_block = slot - block * block_size;
    return block * block_stride + kv_head * head_stride + in_block * v_token_stride;
  }
};

// The densely packed layout documented above.
PAGED_KV_HD PagedKvView make_paged_kv_view(void* k, void* v, KvDtype dtype, int32_t num_blocks,
                                           int32_t block_size, int32_t num_kv_heads,
                                           int32_t head_dim) {
  PagedKvView view;
  view.k = k;
  view.v = v;
  view.dtype = dtype;
  view.num_blocks = num_blocks;
  view.block_size = block_size;
  view.num_kv_heads = num_kv_heads;
  view.head_dim = head_dim;
  view.v_token_stride = head_dim;
  view.head_stride = static_cast<int64_t>(block_size) * head_dim;
  view.block_stride = view.head_stride * num_kv_heads;
  return view;
}

// One step's flattened batch: sequence s owns query tokens [query_start_loc[s],
// query_start_loc[s + 1]) of the step - a decode token (1), a prefill chunk (many) - and, after
// this step's kv_write, context_lens[s] tokens in the cache (cached + new). Token i of
// sequence s's chunk sits at position context_lens[s] - num_new + i and attends causally to
// cache positions [0, that position].
struct PagedBatch {
  int32_t num_seqs = 0;
  int32_t num_tokens = 0;                  // == query_start_loc[num_seqs]
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], non-decreasing, starts at 0
  const int32_t* context_lens = nullptr;     // [num_seqs], >= the sequence's new tokens
  const int32_t* block_tables = nullptr;     // [num_seqs, max_blocks_per_seq] physical block ids
  int32_t max_blocks_per_seq = 0;
  const int64_t* slot_mapping = nullptr;  // [num_tokens] slot of each new token; < 0 = skip
  // Per-sequence scales of this layer (FP8 pool only; the bf16 pool ignores them). kv_write
  // writes the calibrated value into them for sequences with calibrate[s] != 0 (their first
  // prefill chunk) before quantizing; attention reads them after that.
  float* k_scales = nullptr;           // [num_seqs]
  float* v_scales = nullptr;           // [num_seqs]
  const uint8_t* calibrate = nullptr;  // [num_seqs], may be null: nobody calibrates

  // The bf16 recent window (--kv-bf16-window): a sequence's newest tokens stay exact in a small
  // bf16 tail pool (same layout and block_size as the FP8 pool, passed to each kernel as a second
  // PagedKvView) and are quantized into their FP8 slots only when their whole block leaves the
  // window. fp8_lens == nullptr: no window, every position is in the main pool. Otherwise
  // positions [0, fp8_lens[s]) of sequence s are read from the FP8 pool through its block table
  // and positions [fp8_lens[s], context_lens[s]) from its ring of tail_ring_blocks tail blocks:
  // position p sits in tail block tail_slots[s] * tail_ring_blocks + (p / block_size) %
  // tail_ring_blocks, at offset p % block_size. kv_write sends a new token below fp8_lens[s] (after
  // this step) to its FP8 slot and the others to the tail; attention reads both segments in one
  // pass with one online softmax.
  const int32_t* fp8_lens = nullptr;    // [num_seqs] positions read from the FP8 pool
  const int32_t* tail_slots = nullptr;  // [num_seqs] the sequence's ring in the tail pool
  int32_t tail_ring_blocks = 0;

  PAGED_KV_HD bool has_tail() const { return fp8_lens != nullptr; }
  // Slot of position pos of sequence seq in the tail pool (PRECOND: pos >= fp8_lens[seq]).
  PAGED_KV_HD int64_t tail_slot(int32_t seq, int32_t pos, int32_t block_size) const {
    const int64_t block = static_cast<int64_t>(tail_slots[seq]) * tail_ring_blocks + (pos / block_size) % tail_ring_blocks;
    return block * block_size + pos % block_size;
  }

  PAGED_KV_HD int32_t num_new_tokens(int32_t seq) const {
    return query_start_loc[seq + 1] - query_start_loc[seq];
  }
  PAGED_KV_HD const int32_t* block_table(int32_t seq) const {
    return block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  }
};

}  // namespace fp8serve
