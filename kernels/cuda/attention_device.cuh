#pragma once
// Device building blocks of the paged attention kernels (paged_attention_decode.cu,
// paged_attention_prefill.cu): the one FP8 -> float conversion, bf16 <-> float, 16-byte
// global -> shared copies (cp.async), the bf16 tensor-core MMA, and a block-wide exclusive scan
// that the kernels plan their work with. The PTX itself is in ptx.cuh (the emulator runs it).
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/ptx.cuh"
#include "kernels/fp8.hpp"
#include "kernels/paged_kv.hpp"

#define ATTN_DEVICE __device__ __forceinline__
#define ATTN_HD __host__ __device__ __forceinline__
// `#pragma unroll` for nvcc; the host compiler of the emulated build does not know it.
#if defined(__CUDACC__)
#define ATTN_UNROLL _Pragma("unroll")
#define ATTN_NO_UNROLL _Pragma("unroll 1")
#else
#define ATTN_UNROLL
#define ATTN_NO_UNROLL
#endif

namespace fp8serve::cuda::attn {

constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;

// log2 of a power of two: the kernels' sizes that depend on the block size are powers of two, so
// their divisions become shifts (a 32-bit division by a run-time value is ~20 instructions).
ATTN_DEVICE int log2_of(int pow2) { return 31 - __clz(pow2); }

// ---- FP8 E4M3 and bf16 -> float ----------------------------------------------------------------

// The four E4M3 codes of `word` (byte i = element i) as floats, two ways that give
// fp8_e4m3_decode's values (kernels/fp8.hpp) for all 256 codes except NaN's payload:
// - cvt: the hardware conversion (cvt.rn.f16x2.e4m3x2, sm_89+; E4M3 is a subset of fp16, so the
//   fp16 -> fp32 step is exact too); NaN becomes fp16's canonical one.
// - bits: the 7 exponent-mantissa bits moved to a float's bits 20..26 give |x| * 2^-120 exactly
//   (subnormal codes become float subnormals), and the multiply by 2^120 is exact; the two NaN
//   codes are found once per word. Needs IEEE subnormals (nvcc's default -ftz=false).
// Which one is faster in the attention's inner loop is a measurement (bench_attention_cuda): the
// kernels use cvt unless built with FP8SERVE_CUDA_FAST_PATHS=0, and GPUs before sm_89 (which have
// no cvt.e4m3x2) always use bits.
ATTN_DEVICE void fp8x4_to_float_cvt(uint32_t word, float (&out)[4]) {
  ptx::cvt_f32_f16x2(ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(word & 0xffffu)), out[0], out[1]);
  ptx::cvt_f32_f16x2(ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(word >> 16)), out[2], out[3]);
}

ATTN_DEVICE void fp8x4_to_float_bits(uint32_t word, float (&out)[4]) {
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
}

ATTN_DEVICE void fp8x4_to_float(uint32_t word, float (&out)[4]) {
#if FP8SERVE_CUDA_FAST_PATHS && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890)
  fp8x4_to_float_cvt(word, out);
#else
  fp8x4_to_float_bits(word, out);
#endif
}

// bf16 pair (element 0 in the low half) -> floats: exact.
ATTN_DEVICE float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
ATTN_DEVICE float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
ATTN_DEVICE float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// Two floats -> a bf16 pair (a in the low half), rounded to nearest even (bf16_encode's result
// for every non-NaN value).
ATTN_DEVICE uint32_t pack_bf16x2(float a, float b) { return ptx::cvt_bf16x2_f32(a, b); }

// ---- 16-byte global -> shared copies and the bf16 MMA -----------------------------------------
// The kernels call ptx::cp_async_cg16 / cp_async_commit / cp_async_wait<N> and
// ptx::mma_m16n8k16_bf16 directly (ptx.cuh), so that the emulator sees each call's own line: the
// lanes of an mma must all be at the same one.

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

  // The physical block of logical block `logical`.
  ATTN_DEVICE int id(int logical) const { return table != nullptr ? table[logical] : ring_first + logical % ring_blocks; }

  // Block `id`'s first byte; ok = false (and block 0's address) for an id outside the pool.
  ATTN_DEVICE const unsigned char* at(int id, bool& ok) const {
    ok = id >= 0 && id < num_blocks;
    return base + (ok ? id : 0) * block_bytes;
  }

  ATTN_DEVICE const unsigned char* block(int logical, bool& ok) const { return at(id(logical), ok); }
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
  bool one_map = false;  // K and V map logical blocks to the same ids (all but a K-only window's tail)
  int32_t lo = 0, hi = 0;
  float k_scale = 1.0f, v_scale = 1.0f;

  // K's and V's blocks of logical block `logical` (kv_ok = false: outside the pool, read as
  // zeros): one lookup when they share the map.
  ATTN_DEVICE void blocks(int logical, const unsigned char*& k_block, bool& k_ok, const unsigned char*& v_block,
                          bool& v_ok) const {
    const int k_id = k.id(logical);
    k_block = k.at(k_id, k_ok);
    v_block = v.at(one_map ? k_id : v.id(logical), v_ok);
  }
};

// The two segments of an item's keys [lo, hi) of sequence s (kernels/paged_kv.hpp's contract):
// which part of [lo, hi) lives in the main pool (below fp8_lens[s] when the bf16 window is on)
// and which in the tail; an empty one has lo >= hi. Each is built only when it runs (segment()),
// so the kernels do not hold the tail's description in registers while the pool's keys stream.
ATTN_DEVICE int segment_split(const PagedBatch& batch, int s, int lo, int hi) {
  return batch.has_tail() ? max(lo, min(hi, batch.fp8_lens[s])) : hi;
}

// Segment `tail` (0: the main pool's keys, 1: the tail's) of keys [lo, hi).
ATTN_DEVICE KeySegment segment(const PagedKvView& cache, const PagedKvView& tail_view, const PagedBatch& batch, int s,
                               int kv_head, int lo, int hi, bool tail) {
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  const int split = segment_split(batch, s, lo, hi);
  KeySegment seg;
  const int32_t* table = batch.block_table(s);
  seg.v = table_source(cache, cache.v, kv_head, table);
  seg.v_fp8 = fp8;
  seg.v_scale = fp8 ? batch.v_scales[s] : 1.0f;
  if (!tail) {
    seg.k = table_source(cache, cache.k, kv_head, table);
    seg.k_fp8 = fp8;
    seg.k_scale = fp8 ? batch.k_scales[s] : 1.0f;
    seg.one_map = true;
    seg.lo = lo;
    seg.hi = split;
    return seg;
  }
  seg.lo = split;
  seg.hi = batch.has_tail() ? hi : split;
  if (seg.hi <= seg.lo) return seg;
  seg.k = ring_source(tail_view, tail_view.k, kv_head, batch, s);
  seg.k_fp8 = false;
  if (tail_view.v != nullptr) {
    seg.v = ring_source(tail_view, tail_view.v, kv_head, batch, s);
    seg.v_fp8 = false;
    seg.v_scale = 1.0f;
    seg.one_map = true;
  }  // else a K-only window: V stays in the main pool, with its scale
  return seg;
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
  // Not unrolled: a thread counts one sequence up to batch 128 (the runs are threads-wide), and
  // nvcc's 4-wide body (a division a sequence) ran past that only at batch 384 and up.
ATTN_NO_UNROLL
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
ATTN_NO_UNROLL
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
