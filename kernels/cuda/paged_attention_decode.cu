// Decode attention (one new token per sequence) on CUDA cores, flash-decoding style.
//
// Work item = (sequence, KV head, subgroup of up to kRows of its query heads, context
// partition). A CTA of 4 warps takes one item at a time (a persistent grid loops over them);
// its warps take the partition's chunks round-robin, each with its own online softmax, and are
// merged at the end; a partition of a split sequence goes to the workspace and
// paged_merge_kernel combines them. The items are planned on the device by every CTA (two block
// scans over the batch's sequences): the partition size is the one that makes about
// target_items items (two waves of the persistent grid), never below kMinPartition tokens, so a
// small batch of long sequences is split over the whole GPU and a large one is not split at all.
//
// One chunk = 2 KiB of K and 2 KiB of V of one block: C = 2048 / (head_dim * element size)
// tokens (16 for FP8 at head_dim 128, 8 for bf16), capped at the block. A warp copies a chunk
// into its shared-memory stage with 16-byte cp.async per lane (kStages deep, so two chunks per
// warp are in flight while it computes a third), then converts in registers:
//  - scores: K is stored token-interleaved in 4-byte words ([head_dim / P][block][P], P = 4 FP8
//    or 2 bf16 elements), so one lane's 16 bytes are 4 tokens x P dims; it multiplies them with
//    the q values of those dims for every head of its rows (q reused 4x) and a butterfly over the
//    lanes that hold the same 4 tokens completes the dot products;
//  - p.V: each lane owns 4 (8 at head_dim 256) dims of the output of every row and sums over the
//    chunk's tokens, reading p from shared memory: no cross-lane reduction per chunk.
// All accumulation is fp32, across chunks and partitions.
//
// Napkin math (H100/H200, FP8, head_dim 128, GQA group 4 = Llama-3-8B, 8k context, batch 16):
// 16 x 8 KV heads x 8192 tokens x 256 bytes = 268 MB per layer: 56 us at H200's 4.8 TB/s. Per
// SM that is 18 bytes per clock, one 4 KiB chunk (K + V) every ~220 clocks. A chunk costs a
// warp ~850 instructions (512 FMAs for the group's 4 heads, ~190 for conversions - cvt e4m3x2
// -> f16x2 then f16 -> f32 -, ~100 shared loads, 48 shuffles, the softmax): ~210 issue clocks of
// the SM's 4 schedulers, so FP8 decode at group 4 runs near the issue limit at full bandwidth
// (memory-bound below group 4, issue-bound above: group 8 would want tensor cores). The sm_90a
// SASS has more than that (nvdisasm: ~1,600 instructions per chunk at group 4, issue-bound at
// ~55% of HBM; issue 21 moves this case to tensor cores) and
// 162 registers, 3 CTAs per SM (the README's kernel-resources table). Loads in flight: 3 CTAs x
// 4 warps x 2 chunks x 4 KiB = 96 KiB per SM against the ~25 KiB that
// bandwidth x latency (4.8 TB/s x ~0.7 us / 132 SMs) needs; registers stay low because the
// in-flight chunks live in shared memory, not in registers. bf16 moves twice the bytes for half
// the conversion work and is memory-bound throughout.
#include <algorithm>
#include <cmath>
#include <type_traits>

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

// Dims of the output one lane owns in the p.V product.
template <int kD>
constexpr int dims_per_lane() {
  return kD >= 256 ? 8 : 4;
}

// Shared memory: [warps][stages][K chunk | V chunk] | q [rows][kD] f32 | p [warps][64][rows] f32
// | scan scratch [warps] | plan [num_seqs + 1].
struct DecodeSmem {
  int64_t stages, q, p, scratch, plan, total;
};
ATTN_HD DecodeSmem decode_smem(int rows, int dim_pad, int num_seqs) {
  DecodeSmem s{};
  s.stages = 0;
  s.q = s.stages + int64_t{kWarps} * kWarpStageBytes;
  s.p = s.q + int64_t{rows} * dim_pad * 4;
  s.scratch = s.p + int64_t{kWarps} * kMaxChunkTokens * rows * 4;
  s.plan = s.scratch + kWarps * 4;
  s.total = s.plan + (int64_t{num_seqs} + 1) * 4;
  return s;
}

// A warp's running softmax over its chunks: max and sum per row (the same in every lane) and
// the lane's dims of the unnormalised output.
template <int kRows, int kDl>
struct WarpState {
  float m[kRows];
  float l[kRows];
  float acc[kRows][kDl];
};

template <int kD, int kRows>
struct DecodeCta {
  static constexpr int kDl = dims_per_lane<kD>();
  static constexpr int kLanesPerRow = kD / kDl;       // lanes sharing one token in p.V
  static constexpr int kRowGroups = kWarp / kLanesPerRow;

  const AttentionArgs& args;
  unsigned char* smem;
  int lane, warp;

  // One segment through this warp's stages. kKFp8 / kVFp8: its K / V are E4M3 (else bf16).
  template <bool kKFp8, bool kVFp8>
  ATTN_DEVICE void run_segment(const KeySegment& seg, WarpState<kRows, kDl>& st) {
    constexpr int kKElem = kKFp8 ? 1 : 2, kVElem = kVFp8 ? 1 : 2;
    constexpr int kPack = kKFp8 ? 4 : 2;  // elements per 4-byte K word
    constexpr int kMaxElem = kKElem > kVElem ? kKElem : kVElem;
    // V rows are staged kD elements apart, so a row's 16-byte vectors index by shifts.
    constexpr int kRowVectors = kD * kVElem / 16;
    const int block_size = args.cache.block_size, block_shift = log2_of(block_size);
    const int head_dim = args.head_dim;
    const int chunk = min(block_size, kChunkBytes / (kD * kMaxElem));  // tokens, a power of 2 >= 4
    const int chunk_shift = log2_of(chunk);
    const int quad_shift = chunk_shift - 2;  // 16-byte K vectors (4 tokens) per word column
    const int quads = 1 << quad_shift;
    const int k_vectors = head_dim / kPack << quad_shift;
    const int row_vectors = head_dim * kVElem / 16;  // <= kRowVectors
    const int first_chunk = seg.lo >> chunk_shift;
    const int num_chunks = ((seg.hi + chunk - 1) >> chunk_shift) - first_chunk;
    unsigned char* stages = smem + warp * kWarpStageBytes;
    const float* q_s = reinterpret_cast<const float*>(smem + decode_smem(kRows, kD, 0).q);
    float* p_s = reinterpret_cast<float*>(smem + decode_smem(kRows, kD, 0).p) + warp * kMaxChunkTokens * kRows;

    auto issue = [&](int c) {  // chunk c of this segment (c < num_chunks) into stage c % kStages
      unsigned char* stage = stages + (c / kWarps) % kStages * kStageBytes;
      const int pos0 = (first_chunk + c) << chunk_shift;
      const int logical = pos0 >> block_shift;
      bool k_ok = false, v_ok = false;
      const unsigned char* k_block = seg.k.block(logical, k_ok);
      const unsigned char* v_block = seg.v.block(logical, v_ok);
      const int t0 = pos0 & (block_size - 1);
ATTN_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int v = lane + kWarp * i;
        if (v < k_vectors) {
          const int group = v >> quad_shift, quad = v & (quads - 1);
          ptx::cp_async_cg16(stage + v * 16, k_block + ((int64_t{group} << block_shift) + t0 + 4 * quad) * 4,
                             k_ok ? 16 : 0);
        }
      }
ATTN_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int v = lane + kWarp * i;
        const int t = v / kRowVectors, part = v % kRowVectors;
        if (t < chunk && part < row_vectors) {
          const bool ok = v_ok && pos0 + t >= seg.lo && pos0 + t < seg.hi;
          ptx::cp_async_cg16(stage + kChunkBytes + v * 16, v_block + (t0 + t) * seg.v.row_bytes + part * 16,
                             ok ? 16 : 0);
        }
      }
    };

    auto compute = [&](int c) {
      const unsigned char* stage = stages + (c / kWarps) % kStages * kStageBytes;
      const int pos0 = (first_chunk + c) << chunk_shift;
      // Scores of tokens 4 * (lane % quads) + w, partial over this lane's groups.
      float part[4][kRows];
ATTN_UNROLL
      for (int w = 0; w < 4; ++w)
ATTN_UNROLL
        for (int r = 0; r < kRows; ++r) part[w][r] = 0.0f;
ATTN_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int v = lane + kWarp * i;
        if (v < k_vectors) {
          const int group = v >> quad_shift;
          const uint4 raw = *reinterpret_cast<const uint4*>(stage + v * 16);
          const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};  // tokens 4 quad + w
          if constexpr (kKFp8) {  // each word: dims 4 group .. 4 group + 3
            float k[4][4];
ATTN_UNROLL
            for (int w = 0; w < 4; ++w) fp8x4_to_float(words[w], k[w]);
ATTN_UNROLL
            for (int r = 0; r < kRows; ++r) {
              const float4 q = *reinterpret_cast<const float4*>(q_s + r * kD + 4 * group);
ATTN_UNROLL
              for (int w = 0; w < 4; ++w) {  // one FMA per product
                part[w][r] += q.x * k[w][0];
                part[w][r] += q.y * k[w][1];
                part[w][r] += q.z * k[w][2];
                part[w][r] += q.w * k[w][3];
              }
            }
          } else {  // each word: dims 2 group, 2 group + 1
ATTN_UNROLL
            for (int r = 0; r < kRows; ++r) {
              const float2 q = *reinterpret_cast<const float2*>(q_s + r * kD + 2 * group);
ATTN_UNROLL
              for (int w = 0; w < 4; ++w) {
                part[w][r] += q.x * bf16_lo(words[w]);
                part[w][r] += q.y * bf16_hi(words[w]);
              }
            }
          }
        }
      }
      // Complete the dot products over the lanes holding the same tokens (lane % quads).
      for (int offset = quads; offset < kWarp; offset <<= 1)
ATTN_UNROLL
        for (int w = 0; w < 4; ++w)
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) part[w][r] += __shfl_xor_sync(kAllLanes, part[w][r], offset);

      const int first_token = pos0 + 4 * (lane & (quads - 1));
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float chunk_max = -INFINITY;
ATTN_UNROLL
        for (int w = 0; w < 4; ++w) {
          const int pos = first_token + w;
          part[w][r] = pos >= seg.lo && pos < seg.hi ? part[w][r] * seg.k_scale : -INFINITY;
          chunk_max = fmaxf(chunk_max, part[w][r]);
        }
        for (int offset = 1; offset < quads; offset <<= 1)
          chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kAllLanes, chunk_max, offset));
        const float m_new = fmaxf(st.m[r], chunk_max);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no NaN
        const float alpha = exp2f(st.m[r] - m_use);
        float chunk_sum = 0.0f;
ATTN_UNROLL
        for (int w = 0; w < 4; ++w) {
          part[w][r] = exp2f(part[w][r] - m_use);
          chunk_sum += part[w][r];
        }
        for (int offset = 1; offset < quads; offset <<= 1)
          chunk_sum += __shfl_xor_sync(kAllLanes, chunk_sum, offset);
        st.l[r] = st.l[r] * alpha + chunk_sum;
        st.m[r] = m_new;
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) st.acc[r][e] *= alpha;
      }
      if (lane < quads) {
ATTN_UNROLL
        for (int w = 0; w < 4; ++w)
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) p_s[(4 * lane + w) * kRows + r] = part[w][r] * seg.v_scale;
      }
      __syncwarp();

      // p.V: this lane's dims of every row, over the tokens t = lane / kLanesPerRow (mod kRowGroups).
      const int dim0 = lane % kLanesPerRow * kDl;
      if (dim0 < head_dim) {
        for (int t = lane / kLanesPerRow; t < chunk; t += kRowGroups) {
          float v[kDl];
          const unsigned char* row = stage + kChunkBytes + (t * kD + dim0) * kVElem;
          if constexpr (kVFp8) {
ATTN_UNROLL
            for (int h = 0; h < kDl / 4; ++h) {
              float four[4];
              fp8x4_to_float(reinterpret_cast<const uint32_t*>(row)[h], four);
ATTN_UNROLL
              for (int e = 0; e < 4; ++e) v[4 * h + e] = four[e];
            }
          } else {
ATTN_UNROLL
            for (int h = 0; h < kDl / 2; ++h) {
              const uint32_t pair = reinterpret_cast<const uint32_t*>(row)[h];
              v[2 * h] = bf16_lo(pair);
              v[2 * h + 1] = bf16_hi(pair);
            }
          }
          float p[kRows];
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) p[r] = p_s[t * kRows + r];
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
            for (int e = 0; e < kDl; ++e) st.acc[r][e] += p[r] * v[e];
        }
      }
      __syncwarp();  // the stage and p_s are rewritten next
    };

    // A ring of kStages stages per warp: chunk c goes to stage (c / kWarps) % kStages, and
    // every iteration commits one group (empty past the end) so wait<kStages - 1> always
    // means "this iteration's chunk has landed".
    int next = warp;
    for (int s = 0; s < kStages - 1; ++s, next += kWarps) {
      if (next < num_chunks) issue(next);
      ptx::cp_async_commit();
    }
    for (int c = warp; c < num_chunks; c += kWarps, next += kWarps) {
      if (next < num_chunks) issue(next);
      ptx::cp_async_commit();
      ptx::cp_async_wait<kStages - 1>();
      __syncwarp();
      compute(c);
    }
    ptx::cp_async_wait<0>();
    __syncwarp();
  }
};

// The sequences this kernel serves: exactly one new token.
ATTN_DEVICE bool is_decode(const PagedBatch& b, int s) { return b.query_start_loc[s + 1] - b.query_start_loc[s] == 1; }

// Keys the kernels may read for sequence s: its context, within its block table.
ATTN_DEVICE int readable_len(const PagedBatch& b, int s, int block_size) {
  return min(b.context_lens[s], b.max_blocks_per_seq * block_size);
}

template <int kD, int kRows>
__global__ void __launch_bounds__(kThreads) paged_decode_kernel(AttentionArgs args, DecodeWork work) {
  FP8SERVE_DYNAMIC_SHARED(unsigned char, smem);
  using Cta = DecodeCta<kD, kRows>;
  constexpr int kDl = Cta::kDl;
  const PagedBatch& batch = args.batch;
  const int n = batch.num_seqs;
  const int block_size = args.cache.block_size;
  const DecodeSmem layout = decode_smem(kRows, kD, n);
  float* q_s = reinterpret_cast<float*>(smem + layout.q);
  int* scratch = reinterpret_cast<int*>(smem + layout.scratch);
  int* plan = reinterpret_cast<int*>(smem + layout.plan);
  const int tid = static_cast<int>(threadIdx.x);
  const int head_items = args.cache.num_kv_heads * work.subgroups;

  // The plan: the partition size from the total decode context, then items per sequence.
  int partition = work.partition_tokens;
  if (partition == 0) {
    block_exclusive_scan(n, kThreads, [&](int s) { return is_decode(batch, s) ? readable_len(batch, s, block_size) : 0; },
                         plan, scratch);
    const int64_t work_tokens = int64_t{plan[n]} * head_items;
    const int64_t wanted = (work_tokens + work.target_items - 1) / work.target_items;
    const int64_t p = wanted > kDecodeMinPartition ? wanted : kDecodeMinPartition;
    partition = static_cast<int>((p + block_size - 1) / block_size * block_size);
  } else if (partition < 0) {
    partition = max(1, batch.max_blocks_per_seq) * block_size;  // one partition per sequence
  }
  block_exclusive_scan(
      n, kThreads,
      [&](int s) {
        return is_decode(batch, s) ? (readable_len(batch, s, block_size) + partition - 1) / partition * head_items : 0;
      },
      plan, scratch);
  if (blockIdx.x == 0)
    for (int i = tid; i <= n; i += kThreads) work.plan[i] = plan[i];

  Cta cta{args, smem, tid % kWarp, tid / kWarp};
  const int64_t slot_floats = int64_t{kRows} * (kD + 2);
  // plan[n] (the item count) is read from shared memory each time rather than kept in a register
  // across the item's work, which pushed it to local memory (a spill) in some instantiations.
  for (int item = static_cast<int>(blockIdx.x); item < plan[n]; item += static_cast<int>(gridDim.x)) {
    const int s = find_owner(plan, n, item);
    const int local = item - plan[s];
    const int num_parts = (plan[s + 1] - plan[s]) / head_items;
    const int part = local / head_items;
    const int kv_head = local % head_items / work.subgroups;
    const int sub = local % work.subgroups;
    const int head0 = kv_head * args.group + sub * kRows;
    const int rows = min(kRows, args.group - sub * kRows);
    const int context = readable_len(batch, s, block_size);
    const int k0 = part * partition, k1 = min(context, k0 + partition);
    const int token = batch.query_start_loc[s];

    for (int i = tid; i < kRows * kD; i += kThreads) {
      const int r = i / kD, d = i % kD;
      float x = 0.0f;
      if (r < rows && d < args.head_dim)
        x = bf16_bits_to_float(args.q[token * args.q_token_stride + int64_t{head0 + r} * args.head_dim + d]) *
            args.qk_scale;
      q_s[i] = x;
    }
    __syncthreads();

    WarpState<kRows, kDl> st;
ATTN_UNROLL
    for (int r = 0; r < kRows; ++r) {
      st.m[r] = -INFINITY;
      st.l[r] = 0.0f;
ATTN_UNROLL
      for (int e = 0; e < kDl; ++e) st.acc[r][e] = 0.0f;
    }
    // Positions below fp8_lens[s] in the main pool, the rest in the bf16 tail: one softmax.
    if (const KeySegment pool_keys = segment(args.cache, args.tail, batch, s, kv_head, k0, k1, false);
        pool_keys.hi > pool_keys.lo) {
      if (pool_keys.k_fp8) {
        cta.template run_segment<true, true>(pool_keys, st);
      } else {
        cta.template run_segment<false, false>(pool_keys, st);
      }
    }
    if (const KeySegment tail_keys = segment(args.cache, args.tail, batch, s, kv_head, k0, k1, true);
        tail_keys.hi > tail_keys.lo) {
      if (tail_keys.v_fp8) {
        cta.template run_segment<false, true>(tail_keys, st);  // a K-only window
      } else {
        cta.template run_segment<false, false>(tail_keys, st);
      }
    }

    // Merge the warps: each writes (acc, m, l) into its own (drained) stages, then every thread
    // combines the four for some (row, dim).
    for (int offset = Cta::kLanesPerRow; offset < kWarp; offset <<= 1)
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) st.acc[r][e] += __shfl_xor_sync(kAllLanes, st.acc[r][e], offset);
    float* mine = reinterpret_cast<float*>(smem + cta.warp * kWarpStageBytes);  // [rows][kD], m[rows], l[rows]
    if (cta.lane < Cta::kLanesPerRow) {
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) mine[r * kD + cta.lane * kDl + e] = st.acc[r][e];
    }
    if (cta.lane == 0) {
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r) {
        mine[kRows * kD + r] = st.m[r];
        mine[kRows * kD + kRows + r] = st.l[r];
      }
    }
    __syncthreads();
    for (int i = tid; i < rows * args.head_dim; i += kThreads) {
      const int r = i / args.head_dim, d = i % args.head_dim;
      float m_max = -INFINITY;
      for (int w = 0; w < kWarps; ++w)
        m_max = fmaxf(m_max, reinterpret_cast<const float*>(smem + w * kWarpStageBytes)[kRows * kD + r]);
      float sum = 0.0f, o = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        const float* theirs = reinterpret_cast<const float*>(smem + w * kWarpStageBytes);
        const float m_w = theirs[kRows * kD + r];
        if (m_w == -INFINITY) continue;  // this warp saw no keys
        const float weight = exp2f(m_w - m_max);
        sum += theirs[kRows * kD + kRows + r] * weight;
        o += theirs[r * kD + d] * weight;
      }
      if (num_parts == 1) {
        args.out[token * args.out_token_stride + int64_t{head0 + r} * args.head_dim + d] =
            bf16_encode(sum > 0.0f ? o / sum : 0.0f);
      } else {
        float* slot = work.partials + item * slot_floats;
        slot[r * kD + d] = o;
        if (d == 0) {
          slot[kRows * kD + 2 * r] = m_max;
          slot[kRows * kD + 2 * r + 1] = sum;
        }
      }
    }
    __syncthreads();  // q_s and the stages are rewritten by the next item
  }
}

// Combines the partitions of one (sequence, KV head, subgroup) of a split decode sequence:
// out = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p, in partition order.
__global__ void __launch_bounds__(kThreads) paged_merge_kernel(AttentionArgs args, DecodeWork work, int rows_per_item,
                                                               int dim_pad) {
  const int s = static_cast<int>(blockIdx.y);
  const int head_item = static_cast<int>(blockIdx.x);
  const int head_items = args.cache.num_kv_heads * work.subgroups;
  const int first = work.plan[s];
  const int num_parts = (work.plan[s + 1] - first) / head_items;
  if (num_parts <= 1) return;  // not a decode sequence, or written directly by the decode kernel
  const int kv_head = head_item / work.subgroups, sub = head_item % work.subgroups;
  const int head0 = kv_head * args.group + sub * rows_per_item;
  const int rows = min(rows_per_item, args.group - sub * rows_per_item);
  const int token = args.batch.query_start_loc[s];
  const int64_t slot_floats = int64_t{rows_per_item} * (dim_pad + 2);
  for (int i = static_cast<int>(threadIdx.x); i < rows * args.head_dim; i += kThreads) {
    const int r = i / args.head_dim, d = i % args.head_dim;
    float m_run = -INFINITY, sum = 0.0f, o = 0.0f;
    for (int p = 0; p < num_parts; ++p) {
      const float* slot = work.partials + (first + int64_t{p} * head_items + head_item) * slot_floats;
      const float m_p = slot[rows_per_item * dim_pad + 2 * r];
      if (m_p == -INFINITY) continue;
      const float m_new = fmaxf(m_run, m_p);
      const float old_weight = exp2f(m_run - m_new), weight = exp2f(m_p - m_new);
      sum = sum * old_weight + slot[rows_per_item * dim_pad + 2 * r + 1] * weight;
      o = o * old_weight + slot[r * dim_pad + d] * weight;
      m_run = m_new;
    }
    args.out[token * args.out_token_stride + int64_t{head0 + r} * args.head_dim + d] =
        bf16_encode(sum > 0.0f ? o / sum : 0.0f);
  }
}

// Allows the kernel its shared memory and returns its persistent grid for num_seqs sequences.
template <int kD, int kRows>
int32_t prepare_decode(int32_t num_seqs, int32_t sms) {
  const std::size_t shared = static_cast<std::size_t>(decode_smem(kRows, kD, num_seqs).total);
  return persistent_grid(paged_decode_kernel<kD, kRows>, kThreads, shared, sms);
}

template <int kD, int kRows>
void launch_decode_for(const AttentionArgs& args, DecodeWork work, int64_t spare_slots, bool may_split, int32_t sms,
                       cudaStream_t stream) {
  const std::size_t shared = static_cast<std::size_t>(decode_smem(kRows, kD, args.batch.num_seqs).total);
  work.grid = prepare_decode<kD, kRows>(args.batch.num_seqs, sms);
  work.target_items = static_cast<int32_t>(std::min<int64_t>(int64_t{kTargetWaves} * work.grid, spare_slots));
  FP8SERVE_LAUNCH((paged_decode_kernel<kD, kRows>), dim3(static_cast<unsigned>(work.grid)), dim3(kThreads), shared,
                  stream, args, work);
  CUDA_CHECK(cudaGetLastError());
  if (may_split) {
    const unsigned head_items = static_cast<unsigned>(args.cache.num_kv_heads * work.subgroups);
    FP8SERVE_LAUNCH(paged_merge_kernel, dim3(head_items, static_cast<unsigned>(args.batch.num_seqs)), dim3(kThreads),
                    0, stream, args, work, kRows, kD);
    CUDA_CHECK(cudaGetLastError());
  }
}

// Calls op.run<kD, kRows>() for the build that serves (head_dim, group).
template <class Op>
auto with_decode_build(int32_t head_dim, int32_t group, const Op& op) {
  auto rows = [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    switch (decode_rows(group)) {
      case 1: return op.template run<kD, 1>();
      case 2: return op.template run<kD, 2>();
      case 4: return op.template run<kD, 4>();
      default: return op.template run<kD, 8>();
    }
  };
  switch (padded_head_dim(head_dim)) {
    case 32: return rows(std::integral_constant<int, 32>{});
    case 64: return rows(std::integral_constant<int, 64>{});
    case 128: return rows(std::integral_constant<int, 128>{});
    default: return rows(std::integral_constant<int, 256>{});
  }
}

struct PrepareOp {
  int32_t num_seqs, sms;
  template <int kD, int kRows>
  int32_t run() const {
    return prepare_decode<kD, kRows>(num_seqs, sms);
  }
};

struct LaunchOp {
  const AttentionArgs& args;
  const DecodeWork& work;
  int64_t spare_slots;
  bool may_split;
  int32_t sms;
  cudaStream_t stream;
  template <int kD, int kRows>
  int run() const {
    launch_decode_for<kD, kRows>(args, work, spare_slots, may_split, sms, stream);
    return 0;
  }
};

}  // namespace

int32_t decode_rows(int32_t group) {
  if (group <= 1) return 1;
  if (group <= 2) return 2;
  if (group <= 4) return 4;
  return 8;
}

int32_t padded_head_dim(int32_t head_dim) {
  if (head_dim <= 32) return 32;
  if (head_dim <= 64) return 64;
  if (head_dim <= 128) return 128;
  return 256;
}

int64_t decode_slot_floats(int32_t group, int32_t head_dim) {
  return int64_t{decode_rows(group)} * (padded_head_dim(head_dim) + 2);
}


int32_t decode_grid(int32_t group, int32_t head_dim, int32_t num_seqs, int32_t sms) {
  return with_decode_build(head_dim, group, PrepareOp{num_seqs, sms});
}

void launch_decode(const AttentionArgs& args, const DecodeWork& work, int64_t spare_slots, bool may_split,
                   int32_t sms, cudaStream_t stream) {
  with_decode_build(args.head_dim, args.group, LaunchOp{args, work, spare_slots, may_split, sms, stream});
}

}  // namespace fp8serve::cuda::attn
