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

// Copies chunks of one segment into a warp's stages: this lane's share of the warp's 16-byte
// vectors. K vector v (word column w = v / quads, tokens 4q..4q+3, q = v % quads) goes to slot
// w * quads + (q ^ k_swizzle(w)), V vector v (token row t = v / kRowVectors, 16-byte part
// v % kRowVectors) to slot t * kRowVectors + (part ^ v_swizzle(t)); tokens outside the segment
// read as zero V rows (their scores are masked, and 0 x a stale V could be NaN).
//
// Lane l copies vectors l + 32i, i < 4. What does not change from chunk to chunk - its stage
// slots, its offsets inside a block, how many vectors it copies - is worked out once a segment
// and kept in registers, so that a chunk costs one block lookup and, per vector, a 64-bit add
// and the copy. Contract of k_swizzle: it depends on w mod 4 only, so K vectors 32 apart (word
// columns 32 / quads >= 4 apart) land 512 bytes apart.
template <class Shape>
struct ChunkCopy {
  static_assert(kWarp % Shape::kRowVectors == 0, "a V row's vectors are copied by lanes of one warp");
  static constexpr int kTokenStep = kWarp / Shape::kRowVectors;  // V rows from vector i to i + 1
  static constexpr int kWarpBytes = kWarp * 16;                  // one vector per lane
  uint32_t k_dst, v_dst[4];  // stage offsets: K vector i at k_dst + 512 i, V vector i at v_dst[i]
  uint32_t k_src, v_src;     // inside a block, vector 0 at token 0: bytes
  uint32_t k_step, v_step;   // inside a block, from vector i to i + 1: bytes
  int v_token;               // vector 0's token row in the chunk
  int k_count, v_count;      // this lane copies K vectors i < k_count and V vectors i < v_count

  template <class KSwizzle, class VSwizzle>
  ATTN_DEVICE ChunkCopy(const KeySegment& seg, const Shape& sh, int block_size, int lane, KSwizzle k_swizzle,
                        VSwizzle v_swizzle) {
    const int block_shift = log2_of(block_size);
    const int quad = lane & (sh.quads - 1);
    const int group = lane >> sh.quad_shift, group_step = kWarp >> sh.quad_shift;
    k_dst = static_cast<uint32_t>((group * sh.quads + (quad ^ k_swizzle(group))) * 16);
    k_src = static_cast<uint32_t>(((group << block_shift) + 4 * quad) * 4);
    k_step = static_cast<uint32_t>((group_step << block_shift) * 4);
    k_count = min(4, max(0, (sh.k_vectors - lane + kWarp - 1) / kWarp));

    const int part = lane % Shape::kRowVectors;
    v_token = lane / Shape::kRowVectors;
ATTN_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int t = v_token + i * kTokenStep;
      v_dst[i] = static_cast<uint32_t>(kChunkBytes + (t * Shape::kRowVectors + (part ^ v_swizzle(t))) * 16);
      ptx::keep_in_register(v_dst[i]);
    }
    // Offsets inside one block of one head are 32-bit (paged_attention_cuda checks a block's V
    // rows fit): the 64-bit part of an address is the block's.
    const auto row_bytes = static_cast<uint32_t>(seg.v.row_bytes);
    v_src = static_cast<uint32_t>(v_token) * row_bytes + static_cast<uint32_t>(part) * 16u;
    v_step = kTokenStep * row_bytes;
    v_count = part < sh.row_vectors ? min(4, max(0, (sh.chunk - v_token + kTokenStep - 1) / kTokenStep)) : 0;
    ptx::keep_in_register(k_dst);
    ptx::keep_in_register(k_src);
    ptx::keep_in_register(v_src);
    ptx::keep_in_register(k_step);
    ptx::keep_in_register(v_step);
  }

  // Queues the copy of the chunk at position pos0 into `stage`.
  ATTN_DEVICE void issue(const KeySegment& seg, int block_size, int pos0, unsigned char* stage) const {
    const int block_shift = log2_of(block_size);
    const auto t0 = static_cast<uint32_t>(pos0 & (block_size - 1));
    bool k_ok = false, v_ok = false;
    const unsigned char* k_block = nullptr;
    const unsigned char* v_block = nullptr;
    seg.blocks(pos0 >> block_shift, k_block, k_ok, v_block, v_ok);
    const unsigned char* k_first = k_block + (k_src + t0 * 4u);
    const unsigned char* v_first = v_block + (v_src + t0 * static_cast<uint32_t>(seg.v.row_bytes));
    unsigned char* k_stage = stage + k_dst;
    // V row v_token + i * kTokenStep is a key of the segment iff it is in [lo, hi)
    const int rel = pos0 + v_token - seg.lo;
    const auto span = static_cast<unsigned>(seg.hi - seg.lo);
ATTN_UNROLL
    for (int i = 0; i < 4; ++i)
      if (i < k_count) ptx::cp_async_cg16(k_stage + i * kWarpBytes, k_first + i * k_step, k_ok ? 16 : 0);
ATTN_UNROLL
    for (int i = 0; i < 4; ++i) {
      if (i < v_count) {
        const bool ok = v_ok && static_cast<unsigned>(rel + i * kTokenStep) < span;
        ptx::cp_async_cg16(stage + v_dst[i], v_first + i * v_step, ok ? 16 : 0);
      }
    }
  }
};

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
