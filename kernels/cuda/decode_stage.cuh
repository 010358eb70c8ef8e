#pragma once
// What the two decode attention kernels (paged_attention_decode.cu: CUDA cores, decode_simt.cuh;
// tensor cores, decode_mma.cuh) share: the CTA shape, the shared-memory layout, and the copy of
// one chunk of K and V into a warp's stage.
//
// One chunk = 2 KiB of K and 2 KiB of V of one block: C = 2048 / (head_dim * element size)
// tokens (16 for FP8 at head_dim 128, 8 for bf16), capped at the block. A warp copies a chunk
// into its shared-memory stage with 16-byte cp.async per lane (kStages deep, so two chunks per
// warp are in flight while it computes a third). K is stored token-interleaved in 4-byte words
// ([head_dim / P][block][P], P = 4 FP8 or 2 bf16 elements: kernels/paged_kv.hpp) and staged the
// same way, [head_dim / P][C][P]; V rows ([C][head_dim]) as in the pool.
#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/paged_attention_kernels.hpp"

namespace fp8serve::cuda::attn {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kStages = 3;
constexpr int kChunkBytes = 2048;               // K bytes (and V bytes) of one chunk
constexpr int kStageBytes = 2 * kChunkBytes;    // K then V
constexpr int kWarpStageBytes = kStages * kStageBytes;
constexpr int kMaxChunkTokens = 64;             // FP8 at head_dim 32: 2048 / 32

// Shared memory: [warps][stages][K chunk | V chunk] | q [rows][Cta::kQRow] f32 | p [warps][64][rows] f32
// (the CUDA-core kernel only) | scan scratch [warps] | plan [num_seqs + 1]. At the end of an item
// each warp publishes [rows][kD] outputs and 2 x rows statistics over its own (drained) stages, at
// merge_stride = kWarpStageBytes from the previous one; decode_items static_asserts that the slot
// fits (at most 16 rows x (128 + 2) x 4 = 8,320 bytes of the 12 KiB), since a neighbour may still
// be computing in its stages.
struct DecodeSmem {
  int64_t merge_stride, stages, q, p, scratch, plan, total;
};
// q_row: floats from one q row to the next (the kernel's Cta::kQRow); p_rows: p in shared memory
// (the CUDA-core kernel).
ATTN_HD DecodeSmem decode_smem(int rows, int q_row, int num_seqs, bool p_rows = true) {
  DecodeSmem s{};
  s.merge_stride = kWarpStageBytes;
  s.stages = 0;
  s.q = s.stages + int64_t{kWarps} * s.merge_stride;
  s.p = s.q + int64_t{rows} * q_row * 4;
  s.scratch = s.p + (p_rows ? int64_t{kWarps} * kMaxChunkTokens * rows * 4 : 0);
  s.plan = s.scratch + kWarps * 4;
  s.total = s.plan + (int64_t{num_seqs} + 1) * 4;
  return s;
}

// A chunk's geometry for a segment: tokens per chunk (a power of two, 4 to 64) and the 16-byte
// copies of its K and V.
template <int kD, int kKElem, int kVElem>
struct ChunkShape {
  static constexpr int kPack = 4 / kKElem;                      // elements per 4-byte K word
  static constexpr int kMaxElem = kKElem > kVElem ? kKElem : kVElem;
  static constexpr int kRowVectors = kD * kVElem / 16;          // 16-byte vectors per staged V row
  static constexpr int kMaxChunk = kChunkBytes / (kD * kMaxElem) < 32 ? kChunkBytes / (kD * kMaxElem) : 32;
  int chunk, chunk_shift, quad_shift, quads, k_vectors, row_vectors;

  // block_size: 8, 16 or 32 (or a smaller chunk to use)
  ATTN_DEVICE ChunkShape(int block_size, int head_dim) {
    chunk = min(block_size, kMaxChunk);
    chunk_shift = log2_of(chunk);
    quad_shift = chunk_shift - 2;  // 16-byte K vectors (4 tokens) per word column
    quads = 1 << quad_shift;
    k_vectors = head_dim / kPack << quad_shift;
    row_vectors = head_dim * kVElem / 16;  // <= kRowVectors
  }
};

// Queues the copy of the chunk at position pos0 of segment `seg` into `stage` (this lane's share
// of the warp's 16-byte vectors): K vector (word column w, tokens 4q..4q+3) to slot
// w * quads + (q ^ k_swizzle(w)), V vector `part` of token row t to slot
// t * kRowVectors + (part ^ v_swizzle(t)); tokens outside the segment read as zero V rows
// (their scores are masked, and 0 x a stale V could be NaN).
template <class Shape, class KSwizzle, class VSwizzle>
ATTN_DEVICE void issue_chunk(const KeySegment& seg, const Shape& sh, int block_size, int lane, int pos0,
                             unsigned char* stage, KSwizzle k_swizzle, VSwizzle v_swizzle) {
  const int block_shift = log2_of(block_size);
  const int logical = pos0 >> block_shift;
  bool k_ok = false, v_ok = false;
  const unsigned char* k_block = seg.k.block(logical, k_ok);
  const unsigned char* v_block = seg.v.block(logical, v_ok);
  const int t0 = pos0 & (block_size - 1);
  // Offsets inside one block of one head are 32-bit (paged_attention_cuda checks a block's V rows
  // fit): the 64-bit part of an address is the block's.
  const int v_row_bytes = static_cast<int>(seg.v.row_bytes);
ATTN_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int v = lane + kWarp * i;
    if (v < sh.k_vectors) {
      const int group = v >> sh.quad_shift, quad = v & (sh.quads - 1);
      ptx::cp_async_cg16(stage + (group * sh.quads + (quad ^ k_swizzle(group))) * 16,
                         k_block + ((group << block_shift) + t0 + 4 * quad) * 4, k_ok ? 16 : 0);
    }
  }
ATTN_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int v = lane + kWarp * i;
    const int t = v / Shape::kRowVectors, part = v % Shape::kRowVectors;
    if (t < sh.chunk && part < sh.row_vectors) {
      const bool ok = v_ok && pos0 + t >= seg.lo && pos0 + t < seg.hi;
      ptx::cp_async_cg16(stage + kChunkBytes + (t * Shape::kRowVectors + (part ^ v_swizzle(t))) * 16,
                         v_block + ((t0 + t) * v_row_bytes + part * 16), ok ? 16 : 0);
    }
  }
}

// Runs compute(c, stage) for this warp's chunks c = warp, warp + kWarps, ... of a segment of
// num_chunks chunks, issue(c, stage) having queued each: a ring of kStages stages per warp,
// chunk c in stage (c / kWarps) % kStages; every iteration commits one group (empty past the
// end) so wait<kStages - 1> always means "this iteration's chunk has landed".
template <class Issue, class Compute>
ATTN_DEVICE void stream_chunks(unsigned char* stages, int warp, int num_chunks, Issue issue, Compute compute) {
  auto stage_of = [&](int c) { return stages + (c / kWarps) % kStages * kStageBytes; };
  int next = warp;
  for (int s = 0; s < kStages - 1; ++s, next += kWarps) {
    if (next < num_chunks) issue(next, stage_of(next));
    ptx::cp_async_commit();
  }
  for (int c = warp; c < num_chunks; c += kWarps, next += kWarps) {
    if (next < num_chunks) issue(next, stage_of(next));
    ptx::cp_async_commit();
    ptx::cp_async_wait<kStages - 1>();
    __syncwarp();
    compute(c, stage_of(c));
  }
  ptx::cp_async_wait<0>();
  __syncwarp();
}

}  // namespace

}  // namespace fp8serve::cuda::attn
