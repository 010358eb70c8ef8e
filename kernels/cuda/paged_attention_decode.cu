// Decode attention (one new token per sequence), flash-decoding style, on CUDA cores
// (decode_simt.cuh) for GQA groups below kMmaMinGroup and on tensor cores (decode_mma.cuh) from
// it on; both share the work plan, the chunk stages (decode_stage.cuh) and the merges here.
//
// Work item = (sequence, KV head, subgroup of up to kRows of its query heads, context
// partition). A CTA of 4 warps takes one item at a time (a persistent grid loops over them);
// its warps take the partition's chunks round-robin, each with its own online softmax, and are
// merged at the end; a partition of a split sequence goes to the workspace and
// paged_merge_kernel combines them. The items are planned on the device by every CTA (a block
// scan over the batch's sequences). A sequence's partitions depend on its own context length
// alone (decode_partition: at least kDecodeMinPartition tokens, at most kDecodeMaxParts
// partitions), never on the rest of the batch, so a token's attention is bitwise the same
// whatever else the step holds: batch invariance, which speculative decoding's verification
// rows rely on (docs/speculative-decoding.md). All accumulation is fp32, across chunks and
// partitions.
//
// Napkin math (H100/H200, FP8, head_dim 128, GQA group 4 = Llama-3-8B, 8k context, batch 16):
// 16 x 8 KV heads x 8192 tokens x 256 bytes = 268 MB per layer: 56 us at H200's 4.8 TB/s. Per
// SM that is 18 bytes per clock, one 4 KiB chunk (K + V) every ~220 clocks, ~892 issue slots of
// the SM's 4 schedulers. On CUDA cores a chunk costs a warp one FMA per (head, dim, token) plus
// the conversions: the sm_90a SASS has ~800 instructions per chunk at group 1, ~1,600 at group 4
// and ~2,700 at group 8 (docs/cuda.md: the static counts, tests/scripts/sass_count.py), so that kernel
// is issue-bound from group 4 (<= 55% of HBM) and the tensor-core one, whose count hardly
// depends on the group, takes over there. Loads in flight: 4 CTAs (2 at 9-16 query heads per KV
// head) x 4 warps x 2 chunks x 4 KiB = 128 KiB per SM against the ~25 KiB that bandwidth x latency (4.8 TB/s x ~0.7 us
// / 132 SMs) needs: the in-flight chunks live in shared memory, not in registers. bf16 moves
// twice the bytes for half the conversion work and is memory-bound throughout.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/decode_mma.cuh"
#include "kernels/cuda/decode_simt.cuh"
#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda::attn {

namespace {

// The sequences this kernel serves: exactly one new token.
ATTN_DEVICE bool is_decode(const PagedBatch& b, int s) { return b.query_start_loc[s + 1] - b.query_start_loc[s] == 1; }

// Keys the kernels may read for sequence s: its context, within its block table.
ATTN_DEVICE int readable_len(const PagedBatch& b, int s, int block_size) {
  return min(b.context_lens[s], b.max_blocks_per_seq * block_size);
}

// The body of both decode kernels: plan, then items; Cta (DecodeSimtCta or DecodeMmaCta) is the
// math of one warp over a segment's chunks.
template <int kD, int kRows, class Cta>
ATTN_DEVICE void decode_items(const AttentionArgs& args, DecodeWork& work, unsigned char* smem) {
  // A warp stages its chunks at warp * kWarpStageBytes and publishes its merge slot at
  // warp * merge_stride while its neighbours may still compute: the slot must fit in its own stages.
  static_assert(kRows * (kD + 2) * 4 <= kWarpStageBytes, "a warp's merge slot would overwrite its neighbour's live stages");
  // The warps' merge weighs them in q_s: kWarps + 2 floats a row, where a q row holds kQRow.
  static_assert(kWarps + 2 <= Cta::kQRow, "the merge's weights do not fit in q_s");
  const PagedBatch& batch = args.batch;
  const int n = batch.num_seqs;
  const int block_size = args.cache.block_size;
  const DecodeSmem layout = decode_smem(kRows, Cta::kQRow, n, Cta::kPRows);
  float* q_s = reinterpret_cast<float*>(smem + layout.q);
  int* scratch = reinterpret_cast<int*>(smem + layout.scratch);
  int* plan = reinterpret_cast<int*>(smem + layout.plan);
  const int tid = static_cast<int>(threadIdx.x);
  const int head_items = args.cache.num_kv_heads * work.subgroups;

  // The plan: items per sequence, from its own partition size.
  auto partition_of = [&](int s) {
    return work.partition_tokens > 0   ? work.partition_tokens
           : work.partition_tokens < 0 ? max(1, batch.max_blocks_per_seq) * block_size  // one partition
                                       : decode_partition(readable_len(batch, s, block_size), block_size);
  };
  block_exclusive_scan(
      n, kThreads,
      [&](int s) {
        return is_decode(batch, s) ? (readable_len(batch, s, block_size) + partition_of(s) - 1) / partition_of(s) * head_items
                                   : 0;
      },
      plan, scratch);
  if (blockIdx.x == 0)
    for (int i = tid; i <= n; i += kThreads) work.plan[i] = plan[i];

  Cta cta{args, smem, tid % kWarp, tid / kWarp};
  // The warps' merge walks 4 dims at a time (head_dim is a multiple of 16): elements i = 4 tid,
  // 4 (tid + kThreads), ... of an item's rows x head_dim as (row, dim) in steps, without a division.
  const int first_r = 4 * tid / args.head_dim, first_d = 4 * tid % args.head_dim;
  const int step_r = 4 * kThreads / args.head_dim, step_d = 4 * kThreads % args.head_dim;
  const int64_t slot_floats = int64_t{kRows} * (kD + 2);
  // plan[n] (the item count) is read from shared memory each time rather than kept in a register
  // across the item's work, which pushed it to local memory (a spill) in some instantiations.
  for (int item = static_cast<int>(blockIdx.x); item < plan[n]; item += static_cast<int>(gridDim.x)) {
    const int s = find_owner(plan, n, item);
    const int local = item - plan[s];
    // One division an item (two with subgroups), by a runtime value: ~25 instructions each.
    const bool split = plan[s + 1] - plan[s] > head_items;  // partitions to merge (paged_merge_kernel)
    const int part = local / head_items;
    const int head_local = local - part * head_items;
    const int kv_head = work.subgroups == 1 ? head_local : head_local / work.subgroups;
    const int sub = head_local - kv_head * work.subgroups;
    const int head0 = kv_head * args.group + sub * kRows;
    const int rows = min(kRows, args.group - sub * kRows);
    // The sequence's context and token together (one L2 round trip, not one after the other
    // behind the partition's branches).
    const int context = readable_len(batch, s, block_size);
    const int token = batch.query_start_loc[s];
    const int partition = partition_of(s);
    const int k0 = part * partition, k1 = min(context, k0 + partition);

    // The item's q rows, r * head_dim + d from its first (a 32-bit offset: < kRows x 256): 4
    // elements a load where the item's first is 8-byte aligned (head_dim is a multiple of 16),
    // else one; unsigned indices: / and % by kD are shifts.
    const uint16_t* q_item = args.q + token * args.q_token_stride + int64_t{head0} * args.head_dim;
    const float q_scale = Cta::kQkScaleInQ ? args.qk_scale : 1.0f;
    if ((reinterpret_cast<uintptr_t>(q_item) & 7) == 0) {
      for (unsigned i = 4 * tid; i < kRows * kD; i += 4 * kThreads) {
        const int r = static_cast<int>(i / kD), d = static_cast<int>(i % kD);
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < rows && d < args.head_dim) {  // d + 3 too
          const uint2 four = *reinterpret_cast<const uint2*>(q_item + r * args.head_dim + d);
          x[0] = bf16_lo(four.x) * q_scale, x[1] = bf16_hi(four.x) * q_scale;
          x[2] = bf16_lo(four.y) * q_scale, x[3] = bf16_hi(four.y) * q_scale;
        }
ATTN_UNROLL
        for (int e = 0; e < 4; ++e) q_s[Cta::q_index(r, d + e)] = x[e];
      }
    } else {
      for (unsigned i = tid; i < kRows * kD; i += kThreads) {
        const int r = static_cast<int>(i / kD), d = static_cast<int>(i % kD);
        float x = 0.0f;
        if (r < rows && d < args.head_dim) x = bf16_bits_to_float(q_item[r * args.head_dim + d]) * q_scale;
        q_s[Cta::q_index(r, d)] = x;
      }
    }
    __syncthreads();

    typename Cta::State st;
    cta.begin(st);
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

    // Merge the warps: each writes (acc, m, l) into its own (drained) stages. A thread a row then
    // weighs the four (2^(m_w - M), or -1 for a warp that saw no keys) and sums their l, into q_s
    // (read by nobody any more); then every thread combines the four accumulators of some
    // (row, dim) with its row's weights, in warp order.
    cta.publish(st, reinterpret_cast<float*>(smem + cta.warp * layout.merge_stride));
    __syncthreads();
    float* weights = q_s;                             // [warp][row]
    float* row_max = q_s + kWarps * kRows;            // [row]
    float* row_sum = q_s + (kWarps + 1) * kRows;      // [row]
    if (tid < rows) {
      const int r = tid;
      float m_max = -INFINITY;
      for (int w = 0; w < kWarps; ++w)
        m_max = fmaxf(m_max, reinterpret_cast<const float*>(smem + w * layout.merge_stride)[kRows * kD + r]);
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        const float* theirs = reinterpret_cast<const float*>(smem + w * layout.merge_stride);
        const float m_w = theirs[kRows * kD + r];
        float weight = -1.0f;  // this warp saw no keys: skipped
        if (m_w != -INFINITY) {
          weight = exp2f(m_w - m_max);
          sum += theirs[kRows * kD + kRows + r] * weight;
        }
        weights[w * kRows + r] = weight;
      }
      row_max[r] = m_max;
      row_sum[r] = sum;
    }
    __syncthreads();
    for (int i = 4 * tid, r = first_r, d = first_d; i < rows * args.head_dim;
         i += 4 * kThreads, r += step_r, d += step_d) {
      if (d >= args.head_dim) d -= args.head_dim, ++r;
      float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int w = 0; w < kWarps; ++w) {
        const float weight = weights[w * kRows + r];
        if (weight < 0.0f) continue;
        const float4 x = *reinterpret_cast<const float4*>(  // 16-byte aligned: d % 4 == 0, kD % 4 == 0
            reinterpret_cast<const float*>(smem + w * layout.merge_stride) + r * kD + d);
        o[0] += x.x * weight;
        o[1] += x.y * weight;
        o[2] += x.z * weight;
        o[3] += x.w * weight;
      }
      const float sum = row_sum[r];
      if (split) {
        // 8-byte stores: a slot is kRows x (kD + 2) floats, an even number but not always a
        // multiple of 4
        float2* slot = reinterpret_cast<float2*>(work.partials + item * slot_floats + r * kD + d);
        slot[0] = make_float2(o[0], o[1]);
        slot[1] = make_float2(o[2], o[3]);
        if (d == 0) {
          float* stats = work.partials + item * slot_floats + kRows * kD;
          stats[2 * r] = row_max[r];
          stats[2 * r + 1] = sum;
        }
      } else {
        uint16_t* out = args.out + token * args.out_token_stride + int64_t{head0 + r} * args.head_dim + d;
ATTN_UNROLL
        for (int e = 0; e < 4; ++e) out[e] = bf16_encode(sum > 0.0f ? o[e] / sum : 0.0f);
      }
    }
    __syncthreads();  // q_s and the stages are rewritten by the next item
  }
}

template <int kD, int kRows>
__global__ void __launch_bounds__(kThreads, kSimtMinCtas<kD, kRows>) paged_decode_kernel(AttentionArgs args,
                                                                                          DecodeWork work) {
  FP8SERVE_DYNAMIC_SHARED(unsigned char, smem);
  decode_items<kD, kRows, DecodeSimtCta<kD, kRows>>(args, work, smem);
}

template <int kD, int kRows>
__global__ void __launch_bounds__(kThreads, kMmaMinCtas<kRows>) paged_decode_mma_kernel(AttentionArgs args,
                                                                                         DecodeWork work) {
  FP8SERVE_DYNAMIC_SHARED(unsigned char, smem);
  decode_items<kD, kRows, DecodeMmaCta<kD, kRows>>(args, work, smem);
}

// Combines the partitions of one (sequence, KV head, subgroup) of a split decode sequence:
// out = sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p, in partition order. A thread owns
// kMergeDims consecutive outputs of a row (blockIdx.z picks the CTA's share of the item's rows x
// head_dim), so the outputs of an item combine side by side rather than one after another, and
// a partition's max, sum and weights serve all of them; kMergePrefetch partitions' (m, l, o) are
// loaded before any of it is combined, so their loads are in flight together (one round trip a
// group: one for a context of up to kMergePrefetch partitions). Each output combines its
// partitions in their order, with the same operations whatever the grouping.
constexpr int kMergePrefetch = 8;
constexpr int kMergeDims = 4;  // head_dim is a multiple of 16; 8-byte loads (a slot's rows are 8-byte aligned)

__global__ void __launch_bounds__(kThreads) paged_merge_kernel(AttentionArgs args, DecodeWork work, int rows_per_item,
                                                               int dim_pad) {
  const int s = static_cast<int>(blockIdx.y);
  const int head_item = static_cast<int>(blockIdx.x);
  const int head_items = args.cache.num_kv_heads * work.subgroups;
  const int first = work.plan[s];
  const int num_parts = (work.plan[s + 1] - first) / head_items;
  if (num_parts <= 1) return;  // not a decode sequence, or written directly by the decode kernel
  const int kv_head = head_item / work.subgroups, sub = head_item % work.subgroups;
  const int rows = min(rows_per_item, args.group - sub * rows_per_item);
  const int i = (static_cast<int>(blockIdx.z) * kThreads + static_cast<int>(threadIdx.x)) * kMergeDims;
  if (i >= rows * args.head_dim) return;  // a slice past this subgroup's rows (the last may hold fewer)
  const int head0 = kv_head * args.group + sub * rows_per_item;
  const int token = args.batch.query_start_loc[s];
  const int64_t slot_floats = int64_t{rows_per_item} * (dim_pad + 2);
  const int r = i / args.head_dim, d = i % args.head_dim;
  const float* slots = work.partials + (first + head_item) * slot_floats;  // partition p's: + p x head_items slots
  float m_run = -INFINITY, sum = 0.0f, o[kMergeDims] = {};
  for (int p0 = 0; p0 < num_parts; p0 += kMergePrefetch) {
    float m_p[kMergePrefetch], l_p[kMergePrefetch], o_p[kMergePrefetch][kMergeDims];
FP8SERVE_UNROLL
    for (int j = 0; j < kMergePrefetch; ++j) {
      m_p[j] = -INFINITY, l_p[j] = 0.0f;  // past the last partition: skipped below
      if (p0 + j >= num_parts) continue;
      const float* slot = slots + int64_t{p0 + j} * head_items * slot_floats;
      m_p[j] = slot[rows_per_item * dim_pad + 2 * r];
      l_p[j] = slot[rows_per_item * dim_pad + 2 * r + 1];  // read even where m_p is -inf: not used then
FP8SERVE_UNROLL
      for (int e = 0; e < kMergeDims; e += 2) {
        const float2 two = *reinterpret_cast<const float2*>(slot + r * dim_pad + d + e);
        o_p[j][e] = two.x, o_p[j][e + 1] = two.y;
      }
    }
FP8SERVE_UNROLL
    for (int j = 0; j < kMergePrefetch; ++j) {
      if (m_p[j] == -INFINITY) continue;
      const float m_new = fmaxf(m_run, m_p[j]);
      const float old_weight = exp2f(m_run - m_new), weight = exp2f(m_p[j] - m_new);
      sum = sum * old_weight + l_p[j] * weight;
FP8SERVE_UNROLL
      for (int e = 0; e < kMergeDims; ++e) o[e] = o[e] * old_weight + o_p[j][e] * weight;
      m_run = m_new;
    }
  }
  uint16_t* out = args.out + token * args.out_token_stride + int64_t{head0 + r} * args.head_dim + d;
FP8SERVE_UNROLL
  for (int e = 0; e < kMergeDims; ++e) out[e] = bf16_encode(sum > 0.0f ? o[e] / sum : 0.0f);
}

// The decode kernel of a build: CUDA cores or tensor cores.
template <int kD, int kRows, bool kMma>
constexpr auto decode_kernel() {
  if constexpr (kMma) {
    return paged_decode_mma_kernel<kD, kRows>;
  } else {
    return paged_decode_kernel<kD, kRows>;
  }
}

template <int kD, int kRows, bool kMma>
std::size_t decode_shared_bytes(int32_t num_seqs) {
  using Cta = std::conditional_t<kMma, DecodeMmaCta<kD, kRows>, DecodeSimtCta<kD, kRows>>;
  return static_cast<std::size_t>(decode_smem(kRows, Cta::kQRow, num_seqs, Cta::kPRows).total);
}

// Allows the kernel its shared memory and returns its persistent grid for num_seqs sequences.
template <int kD, int kRows, bool kMma>
int32_t prepare_decode(int32_t num_seqs, int32_t sms) {
  return persistent_grid(decode_kernel<kD, kRows, kMma>(), kThreads, decode_shared_bytes<kD, kRows, kMma>(num_seqs),
                         sms);
}

template <int kD, int kRows, bool kMma>
void launch_decode_for(const AttentionArgs& args, const DecodeWork& work, bool may_split, int32_t sms,
                       cudaStream_t stream) {
  const std::size_t shared = decode_shared_bytes<kD, kRows, kMma>(args.batch.num_seqs);
  const int32_t grid = prepare_decode<kD, kRows, kMma>(args.batch.num_seqs, sms);
  FP8SERVE_LAUNCH((decode_kernel<kD, kRows, kMma>()), dim3(static_cast<unsigned>(grid)), dim3(kThreads), shared,
                  stream, args, work);
  CUDA_CHECK(cudaGetLastError());
  if (may_split) {
    const unsigned head_items = static_cast<unsigned>(args.cache.num_kv_heads * work.subgroups);
    // A thread for kMergeDims outputs of the item's rows (a subgroup holds up to kRows of the group's heads).
    constexpr int kPerCta = kThreads * kMergeDims;
    const unsigned slices = static_cast<unsigned>((std::min(kRows, args.group) * args.head_dim + kPerCta - 1) / kPerCta);
    FP8SERVE_LAUNCH(paged_merge_kernel, dim3(head_items, static_cast<unsigned>(args.batch.num_seqs), slices),
                    dim3(kThreads), 0, stream, args, work, kRows, kD);
    CUDA_CHECK(cudaGetLastError());
  }
}

// Calls op.run<kD, kRows, kMma>() for the build that serves (head_dim, group) on that kernel.
template <class Op>
auto with_decode_build(int32_t head_dim, int32_t group, bool mma, const Op& op) {
  auto rows = [&](auto dim) {
    constexpr int kD = decltype(dim)::value;
    if constexpr (kD <= kMmaMaxHeadDim) {  // PRECOND: mma only where decode_on_tensor_cores says so
      if (mma) return decode_rows(group, true) > 8 ? op.template run<kD, 16, true>() : op.template run<kD, 8, true>();
    }
    switch (decode_rows(group, false)) {
      case 1: return op.template run<kD, 1, false>();
      case 2: return op.template run<kD, 2, false>();
      case 4: return op.template run<kD, 4, false>();
      default: return op.template run<kD, 8, false>();
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
  template <int kD, int kRows, bool kMma>
  int32_t run() const {
    return prepare_decode<kD, kRows, kMma>(num_seqs, sms);
  }
};

struct LaunchOp {
  const AttentionArgs& args;
  const DecodeWork& work;
  bool may_split;
  int32_t sms;
  cudaStream_t stream;
  template <int kD, int kRows, bool kMma>
  int run() const {
    launch_decode_for<kD, kRows, kMma>(args, work, may_split, sms, stream);
    return 0;
  }
};

}  // namespace

bool decode_on_tensor_cores(int32_t group, int32_t head_dim, PagedAttentionCudaOptions::DecodeMath math) {
  using Math = PagedAttentionCudaOptions::DecodeMath;
  if (padded_head_dim(head_dim) > kMmaMaxHeadDim) return false;
  return math == Math::mma || (math == Math::best && group >= kMmaMinGroup);
}

int32_t decode_rows(int32_t group, bool mma) {
  if (mma) return group <= 8 ? 8 : 16;
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

int64_t decode_slot_floats(int32_t group, int32_t head_dim, bool mma) {
  return int64_t{decode_rows(group, mma)} * (padded_head_dim(head_dim) + 2);
}

int32_t decode_grid(int32_t group, int32_t head_dim, int32_t num_seqs, int32_t sms, bool mma) {
  return with_decode_build(head_dim, group, mma, PrepareOp{num_seqs, sms});
}

void launch_decode(const AttentionArgs& args, const DecodeWork& work, bool may_split, bool mma, int32_t sms,
                   cudaStream_t stream) {
  with_decode_build(args.head_dim, args.group, mma, LaunchOp{args, work, may_split, sms, stream});
}

}  // namespace fp8serve::cuda::attn
