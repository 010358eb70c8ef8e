#pragma once
// How a kernel sees the paged KV pool and a step's flattened batch (docs/design.md, "The FP8 KV contract").
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

#include "kernels/kv_dtype.hpp"

#if defined(__CUDACC__)
#define PAGED_KV_HD __host__ __device__ __forceinline__
#else
#define PAGED_KV_HD inline
#endif

namespace fp8serve {

// Elements per 4-byte group of K (P above).
PAGED_KV_HD constexpr int32_t kv_k_pack(KvDtype dtype) { return dtype == KvDtype::fp8_e4m3 ? 4 : 2; }

// Tokens per block unless --block-size says otherwise (the CUDA attention takes 8, 16 or 32).
// The one default every layer's options use: config, the engine, the model and the cache.
constexpr int32_t kDefaultBlockSize = 16;

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
  // bf16 tail pool and are quantized into their FP8 slots only when their whole block leaves the
  // window. fp8_lens == nullptr: no window, every position is in the main pool, as before.
  //
  // The tail pool (passed to each kernel as a second PagedKvView, `tail`): dtype bf16, the same
  // layout, block_size, num_kv_heads and head_dim as the main pool, num_blocks = (rings) *
  // tail_ring_blocks. Sequence s owns ring tail_slots[s]: tail blocks [tail_slots[s] *
  // tail_ring_blocks, (tail_slots[s] + 1) * tail_ring_blocks). tail.v == nullptr is a K-only
  // window (--kv-bf16-window-tensors k): the tail holds K alone and V is FP8 at every position.
  //
  // Which segment holds position p of sequence s (the whole contract, for every backend):
  //  - p < fp8_lens[s]: the FP8 pool, through the block table (slot table[p / B] * B + p % B),
  //    with the sequence's frozen k_scales[s] / v_scales[s]; and V always, if tail.v == nullptr.
  //  - fp8_lens[s] <= p < context_lens[s]: the tail, at tail_slot(s, p): ring block
  //    (p / B) % tail_ring_blocks, offset p % B - bf16, exact, no scale.
  //  PRECOND: 0 <= fp8_lens[s] <= context_lens[s], context_lens[s] - fp8_lens[s] <=
  //  tail_ring_blocks * block_size (so no two tail positions share a ring slot), and the main
  //  pool is FP8. The block table still covers every position (the block manager allocates FP8
  //  blocks for the tail's positions too: the spill fills them).
  // A step, per layer: kv_spill (kernels/kv_spill.hpp) moves the positions that leave the
  // window from the tail into their FP8 slots, then kv_write (kernels/kv_write.hpp) writes the
  // step's new tokens - below fp8_lens[s] into their FP8 slots, the others into the tail - and
  // paged_attention (kernels/paged_attention.hpp) reads both segments in one pass with one
  // online softmax. Every FP8 value written while a window is on is the quantization of the
  // value's bf16 rounding, fp8_e4m3_encode(bf16(x) / scale), whether kv_write writes it directly
  // or kv_spill moves it out of the tail: a token's FP8 bytes never depend on the path (a
  // recompute after preemption, or another chunking, writes the same bytes). On the GPU, whose
  // activations are bf16 already, that is the plain conversion.
  //
  // fp8_lens is per sequence (not a formula of the window) because the host decides it: the
  // engine's rule (cache/block_manager.hpp) is fp8_lens = max(the previous step's value,
  // floor((context_len - window) / B) * B): the newest `window` tokens, and up to B - 1 older
  // ones (whole blocks leave the window), are exact; a prefix-cache hit (FP8 already) starts
  // the count at its length, and a recompute after preemption raises it to what the original
  // steps read (server/engine/scheduler.hpp). Kernels take it as given: always a multiple of B there,
  // but nothing in the kernels relies on that.
  const int32_t* fp8_lens = nullptr;    // [num_seqs] positions read from the FP8 pool, after this step
  const int32_t* tail_slots = nullptr;  // [num_seqs] the sequence's ring in the tail pool
  int32_t tail_ring_blocks = 0;         // blocks per ring: window / block_size + 1

  PAGED_KV_HD bool has_tail() const { return fp8_lens != nullptr; }
  // Slot of position pos of sequence seq in the tail pool (PRECOND: pos >= fp8_lens[seq]).
  PAGED_KV_HD int64_t tail_slot(int32_t seq, int32_t pos, int32_t block_size) const {
    return tail_block(seq, pos / block_size) * block_size + pos % block_size;
  }
  // The tail block holding the sequence's logical block b (PRECOND: b >= fp8_lens[seq] / block_size).
  PAGED_KV_HD int64_t tail_block(int32_t seq, int32_t b) const {
    return static_cast<int64_t>(tail_slots[seq]) * tail_ring_blocks + b % tail_ring_blocks;
  }

  PAGED_KV_HD int32_t num_new_tokens(int32_t seq) const {
    return query_start_loc[seq + 1] - query_start_loc[seq];
  }
  PAGED_KV_HD const int32_t* block_table(int32_t seq) const {
    return block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  }
};

}  // namespace fp8serve
