#pragma once
// Device building blocks of the paged attention kernels (paged_attention_decode.cu,
// paged_attention_prefill.cu): the one FP8 -> float conversion, bf16 <-> float, 16-byte
// global -> shared copies (cp.async under nvcc), the bf16 tensor-core MMA, and a block-wide
// exclusive scan that the kernels plan their work with.
//
// Each fast path (inline PTX) sits beside a portable version that the emulator runs and that
// FP8SERVE_CUDA_FAST_PATHS=0 selects on a GPU; the tests check both against the host codec or a
// host reference.
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/fp8.hpp"
#include "kernels/paged_kv.hpp"

#define ATTN_DEVICE __device__ __forceinline__
#define ATTN_HD __host__ __device__ __forceinline__
// `#pragma unroll` for nvcc; the host compiler of the emulated build does not know it.
#if defined(__CUDACC__)
#define ATTN_UNROLL _Pragma("unroll")
#else
#define ATTN_UNROLL
#endif

namespace fp8serve::cuda::attn {

constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;

// log2 of a power of two: the kernels' sizes that depend on the block size are powers of two, so
// their divisions become shifts (a 32-bit division by a run-time value is ~20 instructions).
ATTN_DEVICE int log2_of(int pow2) { return 31 - __clz(pow2); }

// ---- FP8 E4M3 and bf16 -> float ----------------------------------------------------------------

// The four E4M3 codes of `word` (byte i = element i) as floats: exactly fp8_e4m3_decode's values
// (kernels/fp8.hpp) for all 256 codes. Hardware: cvt.rn.f16x2.e4m3x2 (sm_89+; E4M3 is a subset
// of fp16, so the fp16 -> fp32 step is exact too); its NaN is fp16's canonical one, so only
// NaN's payload differs from the host codec. Portable: the 7 exponent-mantissa bits moved to a
// float's bits 20..26 give |x| * 2^-120 exactly (subnormal codes become float subnormals), and
// the multiply by 2^120 is exact; the two NaN codes are found once per word. Needs IEEE
// subnormals (nvcc's default -ftz=false; never build the attention with --use_fast_math).
ATTN_DEVICE void fp8x4_to_float(uint32_t word, float (&out)[4]) {
#if FP8SERVE_CUDA_FAST_PATHS && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t lo, hi;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(static_cast<uint16_t>(word & 0xffffu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(static_cast<uint16_t>(word >> 16)));
  asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}"
      : "=f"(out[0]), "=f"(out[1]) : "r"(lo));
  asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}"
      : "=f"(out[2]), "=f"(out[3]) : "r"(hi));
#else
ATTN_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t b = word >> (8 * i);
    out[i] = __uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)) * 0x1p120f;
  }
  // A byte whose low 7 bits are all ones (0x7f, 0xff) is NaN: adding 1 carries into bit 7.
  const uint32_t nan_bytes = ((word & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  if (nan_bytes != 0) {
ATTN_UNROLL
    for (int i = 0; i < 4; ++i) {
      if (nan_bytes & (0x80u << (8 * i))) out[i] = __uint_as_float(((word >> (8 * i) & 0x80u) << 24) | 0x7fc00000u);
    }
  }
#endif
}

// bf16 pair (element 0 in the low half) -> floats: exact.
ATTN_DEVICE float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
ATTN_DEVICE float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
ATTN_DEVICE float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// Two floats -> a bf16 pair (a in the low half), rounded to nearest even (bf16_encode's result
// for every non-NaN value).
ATTN_DEVICE uint32_t pack_bf16x2(float a, float b) {
#if FP8SERVE_CUDA_FAST_PATHS && defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
#else
  return static_cast<uint32_t>(bf16_encode(a)) | (static_cast<uint32_t>(bf16_encode(b)) << 16);
#endif
}

// ---- 16-byte global -> shared copies ----------------------------------------------------------

// Copies 16 bytes, or writes 16 zero bytes when !valid (src is then not read). Fast path:
// cp.async.cg (bypasses L1: the pool is streamed once), completed by copy_wait<N>() in the
// issuing thread; other threads see the bytes after a barrier that follows the wait.
ATTN_DEVICE void copy16_async(void* smem, const void* gmem, bool valid) {
#if FP8SERVE_CUDA_FAST_PATHS
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
#else
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (valid) v = *static_cast<const uint4*>(gmem);
  *static_cast<uint4*>(smem) = v;
#endif
}

// Closes the group of copies issued since the last commit.
ATTN_DEVICE void copy_commit() {
#if FP8SERVE_CUDA_FAST_PATHS
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
ATTN_DEVICE void copy_wait() {
#if FP8SERVE_CUDA_FAST_PATHS
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// ---- bf16 tensor-core MMA ----------------------------------------------------------------------

// d += a * b for one warp: A 16x16 (row), B 16x8 (col), bf16 inputs, fp32 accumulators, with
// PTX's m16n8k16 fragments (g = lane / 4, t = lane % 4; a pair's first element in the low half):
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
// The portable version computes exactly that from the 32 lanes' fragments, gathered with
// shuffles (products exact, fp32 sums in k order), so the emulator runs the tensor-core path's
// fragment logic too. Every lane of the warp must call it.
ATTN_DEVICE void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if FP8SERVE_CUDA_FAST_PATHS
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane / 4, t = lane % 4;
  float acc[4] = {d[0], d[1], d[2], d[3]};
  for (int src = 0; src < 4; ++src) {  // the lanes holding k = 2 src.. and 2 src + 8..
    const int a_lane = 4 * g + src;
    const uint32_t a_top = __shfl_sync(kAllLanes, a[0], a_lane);     // A[g][2src..]
    const uint32_t a_bottom = __shfl_sync(kAllLanes, a[1], a_lane);  // A[g+8][2src..]
    const uint32_t a_top8 = __shfl_sync(kAllLanes, a[2], a_lane);    // A[g][2src+8..]
    const uint32_t a_bottom8 = __shfl_sync(kAllLanes, a[3], a_lane); // A[g+8][2src+8..]
    for (int col = 0; col < 2; ++col) {  // D columns 2t + col come from B column 2t + col
      const int b_lane = 4 * (2 * t + col) + src;
      const uint32_t b_k = __shfl_sync(kAllLanes, b[0], b_lane);   // B[2src..][2t+col]
      const uint32_t b_k8 = __shfl_sync(kAllLanes, b[1], b_lane);  // B[2src+8..][2t+col]
      acc[col] += bf16_lo(a_top) * bf16_lo(b_k) + bf16_hi(a_top) * bf16_hi(b_k) +
                  bf16_lo(a_top8) * bf16_lo(b_k8) + bf16_hi(a_top8) * bf16_hi(b_k8);
      acc[2 + col] += bf16_lo(a_bottom) * bf16_lo(b_k) + bf16_hi(a_bottom) * bf16_hi(b_k) +
                      bf16_lo(a_bottom8) * bf16_lo(b_k8) + bf16_hi(a_bottom8) * bf16_hi(b_k8);
    }
  }
  for (int i = 0; i < 4; ++i) d[i] = acc[i];
#endif
}

// ---- the pools as the kernels read them --------------------------------------------------------

// Where one tensor (K or V) of a key segment lives: a pool, this KV head's part of its blocks, and
// how a logical block (position / block_size) maps to a physical one - the sequence's block table
// (the main pool) or its ring (the bf16 tail: kernels/paged_kv.hpp).
struct KvSource {
  const unsigned char* base = nullptr;  // pool + the KV head's offset, bytes
  int64_t block_bytes = 0;              // between blocks
  int64_t row_bytes = 0;                // between V rows of a block
  const int32_t* table = nullptr;       // block table row; null: the ring
  int32_t ring_first = 0, ring_blocks = 1;
  int32_t num_blocks = 0;               // ids outside [0, num_blocks) read zeros

  // The block's first byte; ok = false (and block 0's address) for an id outside the pool.
  ATTN_DEVICE const unsigned char* block(int logical, bool& ok) const {
    const int id = table != nullptr ? table[logical] : ring_first + logical % ring_blocks;
    ok = id >= 0 && id < num_blocks;
    return base + (ok ? id : 0) * block_bytes;
  }
};

// K or V (`data`) of one KV head of `view`, through the sequence's block table.
ATTN_DEVICE KvSource table_source(const PagedKvView& view, const void* data, int kv_head, const int32_t* table) {
  const int64_t elem = view.dtype == KvDtype::fp8_e4m3 ? 1 : 2;
  KvSource s;
  s.base = static_cast<const unsigned char*>(data) + kv_head * view.head_stride * elem;
  s.block_bytes = view.block_stride * elem;
  s.row_bytes = view.v_token_stride * elem;
  s.table = table;
  s.num_blocks = view.num_blocks;
  return s;
}

// The same through the sequence's ring of the bf16 tail.
ATTN_DEVICE KvSource ring_source(const PagedKvView& view, const void* data, int kv_head, const PagedBatch& batch,
                                 int seq) {
  KvSource s = table_source(view, data, kv_head, nullptr);
  s.ring_first = batch.tail_slots[seq] * batch.tail_ring_blocks;
  s.ring_blocks = batch.tail_ring_blocks;
  return s;
}

// Keys [lo, hi) of one sequence and KV head, all of one kind: the main pool below fp8_lens, the
// tail above it (its V from the FP8 pool in a K-only window). The scales multiply the scores
// (K) and the probabilities (V) of these keys: the FP8 scales, or 1 for bf16.
struct KeySegment {
  KvSource k, v;
  bool k_fp8 = false, v_fp8 = false;
  int32_t lo = 0, hi = 0;
  float k_scale = 1.0f, v_scale = 1.0f;
};

// The two segments of an item's keys [lo, hi) of sequence s (kernels/paged_kv.hpp's contract);
// an empty one has lo >= hi.
ATTN_DEVICE void key_segments(const PagedKvView& cache, const PagedKvView& tail, const PagedBatch& batch, int s,
                              int kv_head, int lo, int hi, KeySegment& pool_keys, KeySegment& tail_keys) {
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  const int32_t* table = batch.block_table(s);
  const float k_scale = fp8 ? batch.k_scales[s] : 1.0f, v_scale = fp8 ? batch.v_scales[s] : 1.0f;
  const int split = batch.has_tail() ? max(lo, min(hi, batch.fp8_lens[s])) : hi;
  pool_keys.k = table_source(cache, cache.k, kv_head, table);
  pool_keys.v = table_source(cache, cache.v, kv_head, table);
  pool_keys.k_fp8 = pool_keys.v_fp8 = fp8;
  pool_keys.lo = lo;
  pool_keys.hi = split;
  pool_keys.k_scale = k_scale;
  pool_keys.v_scale = v_scale;
  tail_keys.lo = split;
  tail_keys.hi = batch.has_tail() ? hi : split;
  if (tail_keys.hi <= tail_keys.lo) return;
  tail_keys.k = ring_source(tail, tail.k, kv_head, batch, s);
  tail_keys.k_fp8 = false;
  if (tail.v != nullptr) {
    tail_keys.v = ring_source(tail, tail.v, kv_head, batch, s);
    tail_keys.v_fp8 = false;
  } else {  // a K-only window: V stays in the main pool
    tail_keys.v = pool_keys.v;
    tail_keys.v_fp8 = fp8;
    tail_keys.v_scale = v_scale;
  }
}

// ---- work planning -----------------------------------------------------------------------------

// Exclusive prefix sum of count(i) for i in [0, n) into out[0..n] (out[n] = the total), by all
// `threads` threads of the block (warp-multiple); scratch holds threads / 32 ints. Each thread
// sums a contiguous run, the runs' sums are scanned with shuffles, then each thread writes its
// run. Ends with a barrier: out is visible to the whole block.
template <class Count>
ATTN_DEVICE void block_exclusive_scan(int n, int threads, Count count, int* out, int* scratch) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarp, warp = tid / kWarp;
  const int per_thread = (n + threads - 1) / threads;
  const int begin = min(n, tid * per_thread), end = min(n, begin + per_thread);
  int run = 0;
  for (int i = begin; i < end; ++i) run += count(i);
  int inclusive = run;
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const int other = __shfl_up_sync(kAllLanes, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarp - 1) scratch[warp] = inclusive;
  __syncthreads();
  int before = inclusive - run;
  for (int w = 0; w < warp; ++w) before += scratch[w];
  for (int i = begin; i < end; ++i) {
    out[i] = before;
    before += count(i);
  }
  if (tid == threads - 1) out[n] = before;
  __syncthreads();
}

// The i with prefix[i] <= item < prefix[i + 1], for a non-decreasing prefix[0..n] with
// prefix[0] <= item < prefix[n].
ATTN_DEVICE int find_owner(const int* prefix, int n, int item) {
  int lo = 0, hi = n;  // invariant: prefix[lo] <= item < prefix[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (prefix[mid] <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace fp8serve::cuda::attn
