// kv_write on the GPU (kernels/kv_write.hpp): a step's new K and V (bf16, after RoPE) into
// their slots of one layer's paged pool, K and V in one fused kernel.
//
// FP8 pool: q = E4M3(x / scale) with the sequence's scale - a true IEEE division (div_rn, never
// a reciprocal), then the codec of kernels/fp8.hpp (or, under FP8SERVE_CUDA_FAST_PATHS, the
// hardware cvt.rn.satfinite.e4m3x2, bit-identical: tests/unit/gpu/test_fp8_codec_gpu.cpp), so
// every byte equals the host's. Elements with |x / scale| > 464 are counted (KvWriteCounts, one
// atomicAdd per warp). bf16 pool: the activations are bf16 already, so their bits are stored.
// The pool layout is kernels/paged_kv.hpp's: K [blocks, kv_heads, head_dim / P, block_size, P]
// (4-byte groups of P elements, block_size groups apart), V [blocks, kv_heads, block_size,
// head_dim]. slot < 0: the token is padding and is skipped. With the bf16 recent window
// (batch.has_tail()) a token at position >= fp8_lens[s] goes to the tail pool in bf16, at
// batch.tail_slot(); a slot outside its pool raises kErrorSlot and is skipped.
//
// Calibration (batch.calibrate[s] != 0, FP8 only) runs first, as its own pass: grid
// (splits, sequences); each block takes a max over its share of the sequence's new K and V,
// folds it into the sequence's slot with an integer atomicMax (the bits of non-negative floats
// order like the floats), and the last block to finish - a threadfence-and-ticket pattern -
// turns the amax into calibrate_kv_scale(amax, margin), writes k_scales[s] / v_scales[s] and
// zeroes the slot for the next launch. The write kernel then reads those scales.
//
// Launch of the write: 256 threads a block, a tile of whole tokens per block; a thread moves 8
// elements (one 16-byte load each of K and V) of one head: two 4-byte stores of K groups and one
// 8-byte store of the V row for FP8. The first threads of a block route the tile's tokens
// (sequence, position, slot, scales) into shared memory once.
#include <stdexcept>
#include <string>

#include "cache/kv_scales.hpp"
#include "kernels/cuda/device_util.cuh"

#if FP8SERVE_CUDA_FAST_PATHS
#include <cuda_fp8.h>
#endif

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTileTokens = 64;
constexpr int kMaxSplits = 128;

enum Destination : int8_t { kSkip = 0, kMain = 1, kTail = 2 };

struct KvWriteArgs {
  const std::uint16_t* k;  // [num_tokens, num_kv_heads, head_dim] bf16
  const std::uint16_t* v;
  int64_t k_stride;
  int64_t v_stride;
  PagedKvView cache;
  PagedKvView tail;
  PagedBatch batch;
  int32_t vecs_per_head;   // head_dim / kVec
  int32_t tile_tokens;     // tokens per block
  KvWriteCounts* counts;   // device, or nullptr
  unsigned* errors;
};

// The sequence owning token t: the last s with query_start_loc[s] <= t (empty sequences skip).
FP8SERVE_DEVICE int32_t sequence_of(const PagedBatch& b, int32_t t) {
  int32_t lo = 0;
  int32_t hi = b.num_seqs;  // query_start_loc[lo] <= t < query_start_loc[hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (b.query_start_loc[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

FP8SERVE_DEVICE uint32_t encode_fp8x2(float a, float b) {
#if FP8SERVE_CUDA_FAST_PATHS && defined(__CUDA_ARCH__)
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
#else
  return static_cast<uint32_t>(fp8_e4m3_encode(a)) | (static_cast<uint32_t>(fp8_e4m3_encode(b)) << 8);
#endif
}

template <int kVec>
FP8SERVE_DEVICE void load_bits(const std::uint16_t* p, std::uint16_t (&out)[kVec]) {
  if constexpr (kVec == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
FP8SERVE_UNROLL
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = static_cast<std::uint16_t>(words[i] & 0xffffu);
      out[2 * i + 1] = static_cast<std::uint16_t>(words[i] >> 16);
    }
  } else {
    out[0] = p[0];
  }
}

// bf16 pool (main or tail): K in 2-element groups (4-byte words), V as a 16-byte row piece.
template <int kVec>
FP8SERVE_DEVICE void store_bf16_pool(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                     const std::uint16_t (&k)[kVec], const std::uint16_t (&v)[kVec]) {
  auto* k_pool = static_cast<std::uint16_t*>(view.k);
  auto* v_pool = static_cast<std::uint16_t*>(view.v);
  if constexpr (kVec == 8) {
FP8SERVE_UNROLL
    for (int g = 0; g < kVec / 2; ++g) {
      const uint32_t word = static_cast<uint32_t>(k[2 * g]) | (static_cast<uint32_t>(k[2 * g + 1]) << 16);
      *reinterpret_cast<uint32_t*>(k_pool + view.k_offset(slot, head, d + 2 * g)) = word;
    }
    uint4 row;
    row.x = static_cast<uint32_t>(v[0]) | (static_cast<uint32_t>(v[1]) << 16);
    row.y = static_cast<uint32_t>(v[2]) | (static_cast<uint32_t>(v[3]) << 16);
    row.z = static_cast<uint32_t>(v[4]) | (static_cast<uint32_t>(v[5]) << 16);
    row.w = static_cast<uint32_t>(v[6]) | (static_cast<uint32_t>(v[7]) << 16);
    *reinterpret_cast<uint4*>(v_pool + view.v_offset(slot, head) + d) = row;
  } else {
    k_pool[view.k_offset(slot, head, d)] = k[0];
    v_pool[view.v_offset(slot, head) + d] = v[0];
  }
}

// FP8 pool: quantizes kVec elements of K and V with their scales; K in 4-byte groups, V as an
// 8-byte row piece. Returns the saturated K and V counts through k_sat / v_sat.
template <int kVec>
FP8SERVE_DEVICE void store_fp8_pool(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                    const std::uint16_t (&k)[kVec], const std::uint16_t (&v)[kVec], float k_scale,
                                    float v_scale, unsigned& k_sat, unsigned& v_sat) {
  float yk[kVec], yv[kVec];
FP8SERVE_UNROLL
  for (int i = 0; i < kVec; ++i) {
    yk[i] = div_rn(bf16_decode(k[i]), k_scale);
    yv[i] = div_rn(bf16_decode(v[i]), v_scale);
    k_sat += kv_value_saturates(yk[i]) ? 1u : 0u;
    v_sat += kv_value_saturates(yv[i]) ? 1u : 0u;
  }
  auto* k_pool = static_cast<uint8_t*>(view.k);
  auto* v_pool = static_cast<uint8_t*>(view.v);
  if constexpr (kVec == 8) {
FP8SERVE_UNROLL
    for (int g = 0; g < 2; ++g) {
      const uint32_t word = encode_fp8x2(yk[4 * g], yk[4 * g + 1]) | (encode_fp8x2(yk[4 * g + 2], yk[4 * g + 3]) << 16);
      *reinterpret_cast<uint32_t*>(k_pool + view.k_offset(slot, head, d + 4 * g)) = word;
    }
    uint2 row;
    row.x = encode_fp8x2(yv[0], yv[1]) | (encode_fp8x2(yv[2], yv[3]) << 16);
    row.y = encode_fp8x2(yv[4], yv[5]) | (encode_fp8x2(yv[6], yv[7]) << 16);
    *reinterpret_cast<uint2*>(v_pool + view.v_offset(slot, head) + d) = row;
  } else {
    k_pool[view.k_offset(slot, head, d)] = static_cast<uint8_t>(encode_fp8x2(yk[0], 0.0f) & 0xffu);
    v_pool[view.v_offset(slot, head) + d] = static_cast<uint8_t>(encode_fp8x2(yv[0], 0.0f) & 0xffu);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(const KvWriteArgs a) {
  FP8SERVE_SHARED(int64_t[kMaxTileTokens], s_slot);
  FP8SERVE_SHARED(float[kMaxTileTokens], s_k_scale);
  FP8SERVE_SHARED(float[kMaxTileTokens], s_v_scale);
  FP8SERVE_SHARED(int8_t[kMaxTileTokens], s_dest);
  const PagedBatch& b = a.batch;
  const int32_t first = static_cast<int32_t>(blockIdx.x) * a.tile_tokens;
  const int32_t count = b.num_tokens - first < a.tile_tokens ? b.num_tokens - first : a.tile_tokens;
  const int32_t row = a.cache.num_kv_heads * a.cache.head_dim;
  const bool fp8 = a.cache.dtype == KvDtype::fp8_e4m3;
  unsigned long long elements = 0;

  // Route the tile's tokens: where each goes, with which scales.
  if (static_cast<int32_t>(threadIdx.x) < count) {
    const int32_t t = first + static_cast<int32_t>(threadIdx.x);
    const int32_t s = sequence_of(b, t);
    const int64_t slot = b.slot_mapping[t];
    int8_t dest = kSkip;
    int64_t where = slot;
    if (slot >= 0) {
      const int32_t pos = b.context_lens[s] - b.num_new_tokens(s) + (t - b.query_start_loc[s]);
      const bool to_tail = b.has_tail() && pos >= b.fp8_lens[s];
      const PagedKvView& pool = to_tail ? a.tail : a.cache;
      where = to_tail ? b.tail_slot(s, pos, a.tail.block_size) : slot;
      if (where >= 0 && where < static_cast<int64_t>(pool.num_blocks) * pool.block_size) {
        dest = to_tail ? kTail : kMain;
      } else {
        raise_error(a.errors, kErrorSlot);
      }
    }
    s_slot[threadIdx.x] = where;
    s_dest[threadIdx.x] = dest;
    s_k_scale[threadIdx.x] = fp8 && dest == kMain ? b.k_scales[s] : 1.0f;
    s_v_scale[threadIdx.x] = fp8 && dest == kMain ? b.v_scales[s] : 1.0f;
    elements = dest == kMain ? static_cast<unsigned long long>(row) : 0ull;
  }
  __syncthreads();

  const int32_t items = a.cache.num_kv_heads * a.vecs_per_head;
  unsigned k_sat = 0;
  unsigned v_sat = 0;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count * items; i += static_cast<int32_t>(blockDim.x)) {
    const int32_t tt = i / items;
    const int8_t dest = s_dest[tt];
    if (dest == kSkip) continue;
    const int32_t item = i - tt * items;
    const int32_t head = item / a.vecs_per_head;
    const int32_t d = (item - head * a.vecs_per_head) * kVec;
    const int64_t t = first + tt;
    std::uint16_t k[kVec], v[kVec];
    load_bits<kVec>(a.k + t * a.k_stride + item * kVec, k);
    load_bits<kVec>(a.v + t * a.v_stride + item * kVec, v);
    if (dest == kTail) {
      store_bf16_pool<kVec>(a.tail, s_slot[tt], head, d, k, v);
    } else if (fp8) {
      store_fp8_pool<kVec>(a.cache, s_slot[tt], head, d, k, v, s_k_scale[tt], s_v_scale[tt], k_sat, v_sat);
    } else {
      store_bf16_pool<kVec>(a.cache, s_slot[tt], head, d, k, v);
    }
  }

  if (a.counts != nullptr) {  // uniform: every thread of the block reaches the shuffles
    const unsigned long long k_total = warp_sum_u64(k_sat);
    const unsigned long long v_total = warp_sum_u64(v_sat);
    const unsigned long long e_total = warp_sum_u64(elements);
    if (threadIdx.x % kWarpSize == 0) {
      if (k_total) atomicAdd(reinterpret_cast<unsigned long long*>(&a.counts->num_k_saturated), k_total);
      if (v_total) atomicAdd(reinterpret_cast<unsigned long long*>(&a.counts->num_v_saturated), v_total);
      if (e_total) atomicAdd(reinterpret_cast<unsigned long long*>(&a.counts->num_elements), e_total);
    }
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) kv_amax_kernel(const KvWriteArgs a, float margin,
                                                            KvCalibrationSlot* slots) {
  FP8SERVE_SHARED(float[kWarpSize], scratch);
  const PagedBatch& b = a.batch;
  const int32_t s = static_cast<int32_t>(blockIdx.y);
  if (b.calibrate[s] == 0) return;  // the whole block leaves together
  const int32_t first = b.query_start_loc[s];
  const int64_t row_vecs = static_cast<int64_t>(a.cache.num_kv_heads) * a.vecs_per_head;
  const int64_t n = static_cast<int64_t>(b.num_new_tokens(s)) * row_vecs;
  float k_amax = 0.0f;
  float v_amax = 0.0f;
  const MaxOp max_op;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = first + i / row_vecs;
    const int64_t at = (i % row_vecs) * kVec;  // a token's heads are contiguous
    float k[kVec], v[kVec];
    load_bf16<kVec>(a.k + t * a.k_stride + at, k);
    load_bf16<kVec>(a.v + t * a.v_stride + at, v);
FP8SERVE_UNROLL
    for (int e = 0; e < kVec; ++e) {
      k_amax = max_op(k_amax, fabsf(k[e]));
      v_amax = max_op(v_amax, fabsf(v[e]));
    }
  }
  k_amax = block_reduce(k_amax, max_op, 0.0f, scratch);
  v_amax = block_reduce(v_amax, max_op, 0.0f, scratch);
  if (threadIdx.x != 0) return;
  KvCalibrationSlot* slot = slots + s;
  atomicMax(&slot->k_amax_bits, fp8_float_bits(k_amax));
  atomicMax(&slot->v_amax_bits, fp8_float_bits(v_amax));
  __threadfence();  // our maxima are visible before our ticket
  if (atomicAdd(&slot->blocks_done, 1u) != gridDim.x - 1) return;
  // The last block of sequence s: every block's maximum is in.
  const float k_max = fp8_bits_float(atomicOr(&slot->k_amax_bits, 0u));
  const float v_max = fp8_bits_float(atomicOr(&slot->v_amax_bits, 0u));
  b.k_scales[s] = calibrate_kv_scale(k_max, margin);
  b.v_scales[s] = calibrate_kv_scale(v_max, margin);
  slot->k_amax_bits = 0;
  slot->v_amax_bits = 0;
  slot->blocks_done = 0;
}

// 16-byte vectors need every row piece aligned: bases and strides multiples of 16 bytes for bf16
// and of 8 for FP8 (a multiple of 8 elements covers both).
bool pool_vec_ok(const PagedKvView& view) {
  return aligned_to(view.k, 16) && aligned_to(view.v, 16) && view.block_stride % 8 == 0 && view.head_stride % 8 == 0 &&
         view.v_token_stride % 8 == 0;
}

void check_view(const PagedKvView& view, const char* what) {
  if (view.k == nullptr || view.v == nullptr || view.num_blocks < 1 || view.block_size < 1 || view.num_kv_heads < 1 ||
      view.head_dim < 1 || view.head_dim % kv_k_pack(view.dtype) != 0 ||
      view.head_stride < static_cast<int64_t>(view.block_size) * view.head_dim ||
      view.v_token_stride < view.head_dim || view.block_stride < view.head_stride * view.num_kv_heads) {
    throw std::invalid_argument(std::string("kv_write (cuda): bad ") + what + " view");
  }
}

template <int kVec>
void launch(const KvWriteArgs& a, float margin, KvCalibrationSlot* calibration, cudaStream_t stream) {
  const PagedBatch& b = a.batch;
  if (a.cache.dtype == KvDtype::fp8_e4m3 && b.calibrate != nullptr) {
    int64_t splits = b.num_tokens / 32;
    splits = splits < 1 ? 1 : (splits > kMaxSplits ? kMaxSplits : splits);
    FP8SERVE_LAUNCH((kv_amax_kernel<kVec>), dim3(static_cast<unsigned>(splits), static_cast<unsigned>(b.num_seqs)),
                    dim3(kThreads), 0, stream, a, margin, calibration);
    CUDA_CHECK(cudaGetLastError());
  }
  const int64_t blocks = div_up(b.num_tokens, a.tile_tokens);
  FP8SERVE_LAUNCH((kv_write_kernel<kVec>), dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void kv_write_cuda(const KvWriteParams& p, KvCalibrationSlot* calibration, unsigned* errors, cudaStream_t stream) {
  const PagedKvView& cache = p.cache;
  const PagedBatch& b = p.batch;
  check_view(cache, "cache");
  if (b.has_tail()) {
    check_view(p.tail, "tail");
    if (p.tail.dtype != KvDtype::bf16 || p.tail.num_kv_heads != cache.num_kv_heads ||
        p.tail.head_dim != cache.head_dim || b.tail_slots == nullptr || b.tail_ring_blocks < 1) {
      throw std::invalid_argument("kv_write (cuda): the tail pool must be bf16 with the cache's heads, and "
                                  "tail_slots / tail_ring_blocks set");
    }
  }
  if (b.num_seqs < 1 || b.num_tokens < 0 || b.query_start_loc == nullptr || b.context_lens == nullptr) {
    throw std::invalid_argument("kv_write (cuda): bad batch");
  }
  if (b.num_tokens == 0) return;
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  auto bad_stride = [row](int64_t stride) { return stride != 0 && stride < row; };
  if (p.k == nullptr || p.v == nullptr || bad_stride(p.k_token_stride) || bad_stride(p.v_token_stride) ||
      b.slot_mapping == nullptr) {
    throw std::invalid_argument("kv_write (cuda): null k/v/slot_mapping or token stride (not 0) < num_kv_heads * head_dim");
  }
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  if (fp8 && (b.k_scales == nullptr || b.v_scales == nullptr)) {
    throw std::invalid_argument("kv_write (cuda): FP8 pool needs k_scales and v_scales");
  }
  if (fp8 && b.calibrate != nullptr) {
    validate_kv_scale_margin(p.scale_margin);
    if (calibration == nullptr) throw std::invalid_argument("kv_write (cuda): calibration needs its workspace");
  }
  KvWriteArgs a{};
  a.k = static_cast<const std::uint16_t*>(p.k);
  a.v = static_cast<const std::uint16_t*>(p.v);
  a.k_stride = p.k_token_stride ? p.k_token_stride : row;
  a.v_stride = p.v_token_stride ? p.v_token_stride : row;
  a.cache = cache;
  a.tail = p.tail;
  a.batch = b;
  a.counts = p.counts;
  a.errors = errors;
  const bool vec = cache.head_dim % kVec8 == 0 && vec8_ok(a.k, a.k_stride, row) && vec8_ok(a.v, a.v_stride, row) &&
                   pool_vec_ok(cache) && (!b.has_tail() || pool_vec_ok(p.tail));
  const int kVec = vec ? kVec8 : 1;
  a.vecs_per_head = cache.head_dim / kVec;
  const int64_t items = row / kVec;
  const int64_t tile = kThreads / items;
  a.tile_tokens = static_cast<int32_t>(tile < 1 ? 1 : (tile > kMaxTileTokens ? kMaxTileTokens : tile));
  if (vec) {
    launch<kVec8>(a, p.scale_margin, calibration, stream);
  } else {
    launch<1>(a, p.scale_margin, calibration, stream);
  }
}

}  // namespace fp8serve::cuda
