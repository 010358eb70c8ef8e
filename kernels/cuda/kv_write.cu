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
// batch.tail_slot() - its K only when the window is K-only (tail.v == nullptr), V then going to
// the FP8 pool as for older positions; the counts cover what the main pool receives. A slot
// outside its pool raises kErrorSlot and is skipped.
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

#include "kernels/cuda/kv_store.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTileTokens = 64;
constexpr int kMaxSplits = 128;

// Where a token's K and V rows go (bits of s_dest).
enum Destination : int8_t { kKMain = 1, kKTail = 2, kVMain = 4, kVTail = 8 };

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

FP8SERVE_DEVICE bool in_pool(const PagedKvView& view, int64_t slot) {
  return slot >= 0 && slot < static_cast<int64_t>(view.num_blocks) * view.block_size;
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(const KvWriteArgs a) {
  FP8SERVE_SHARED(int64_t[kMaxTileTokens], s_slot);
  FP8SERVE_SHARED(int64_t[kMaxTileTokens], s_tail_slot);
  FP8SERVE_SHARED(float[kMaxTileTokens], s_k_scale);
  FP8SERVE_SHARED(float[kMaxTileTokens], s_v_scale);
  FP8SERVE_SHARED(int8_t[kMaxTileTokens], s_dest);
  const PagedBatch& b = a.batch;
  const int32_t first = static_cast<int32_t>(blockIdx.x) * a.tile_tokens;
  const int32_t count = b.num_tokens - first < a.tile_tokens ? b.num_tokens - first : a.tile_tokens;
  const int32_t row = a.cache.num_kv_heads * a.cache.head_dim;
  const bool fp8 = a.cache.dtype == KvDtype::fp8_e4m3;
  unsigned long long k_elements = 0, v_elements = 0;

  // Route the tile's tokens once: where each row goes, with which scales.
  if (static_cast<int32_t>(threadIdx.x) < count) {
    const int32_t t = first + static_cast<int32_t>(threadIdx.x);
    const int32_t s = sequence_of(b, t);
    const int64_t slot = b.slot_mapping[t];
    int8_t dest = 0;
    int64_t tail_slot = -1;
    if (slot >= 0) {  // else padding: no cache slot
      const int32_t pos = b.context_lens[s] - b.num_new_tokens(s) + (t - b.query_start_loc[s]);
      const bool k_to_tail = b.has_tail() && pos >= b.fp8_lens[s];
      const bool v_to_tail = k_to_tail && a.tail.v != nullptr;
      if (k_to_tail) tail_slot = b.tail_slot(s, pos, a.tail.block_size);
      const bool main_ok = (k_to_tail && v_to_tail) || in_pool(a.cache, slot);
      const bool tail_ok = !k_to_tail || in_pool(a.tail, tail_slot);
      if (main_ok && tail_ok) {
        dest = static_cast<int8_t>((k_to_tail ? kKTail : kKMain) | (v_to_tail ? kVTail : kVMain));
      } else {
        raise_error(a.errors, kErrorSlot);
      }
    }
    s_slot[threadIdx.x] = slot;
    s_tail_slot[threadIdx.x] = tail_slot;
    s_dest[threadIdx.x] = dest;
    s_k_scale[threadIdx.x] = fp8 && (dest & kKMain) ? b.k_scales[s] : 1.0f;
    s_v_scale[threadIdx.x] = fp8 && (dest & kVMain) ? b.v_scales[s] : 1.0f;
    k_elements = dest & kKMain ? static_cast<unsigned long long>(row) : 0ull;
    v_elements = dest & kVMain ? static_cast<unsigned long long>(row) : 0ull;
  }
  __syncthreads();

  const int32_t items = a.cache.num_kv_heads * a.vecs_per_head;
  unsigned long long k_sat = 0, v_sat = 0;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count * items; i += static_cast<int32_t>(blockDim.x)) {
    const int32_t tt = i / items;
    const int8_t dest = s_dest[tt];
    if (dest == 0) continue;
    const int32_t item = i - tt * items;
    const int32_t head = item / a.vecs_per_head;
    const int32_t d = (item - head * a.vecs_per_head) * kVec;
    const int64_t t = first + tt;
    std::uint16_t k[kVec], v[kVec];
    load_bits<kVec>(a.k + t * a.k_stride + item * kVec, k);
    load_bits<kVec>(a.v + t * a.v_stride + item * kVec, v);
    if (dest & kKTail) {
      store_k_bf16<kVec>(a.tail, s_tail_slot[tt], head, d, k);
    } else if (fp8) {
      k_sat += store_k_fp8<kVec>(a.cache, s_slot[tt], head, d, k, s_k_scale[tt]);
    } else {
      store_k_bf16<kVec>(a.cache, s_slot[tt], head, d, k);
    }
    if (dest & kVTail) {
      store_v_bf16<kVec>(a.tail, s_tail_slot[tt], head, d, v);
    } else if (fp8) {
      v_sat += store_v_fp8<kVec>(a.cache, s_slot[tt], head, d, v, s_v_scale[tt]);
    } else {
      store_v_bf16<kVec>(a.cache, s_slot[tt], head, d, v);
    }
  }
  if (a.counts != nullptr) add_counts(a.counts, k_elements, v_elements, k_sat, v_sat);  // uniform branch
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

// The views' host-visible fields; a null V in the tail is a K-only window.
void check_view(const PagedKvView& view, bool v_may_be_null, const char* what) {
  if (view.k == nullptr || (view.v == nullptr && !v_may_be_null) || view.num_blocks < 1 || view.block_size < 1 ||
      view.num_kv_heads < 1 || view.head_dim < 1 || view.head_dim % kv_k_pack(view.dtype) != 0 ||
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
  check_view(cache, false, "cache");
  if (b.has_tail()) {
    check_view(p.tail, true, "tail");
    if (p.tail.dtype != KvDtype::bf16 || cache.dtype != KvDtype::fp8_e4m3 || p.tail.num_kv_heads != cache.num_kv_heads ||
        p.tail.head_dim != cache.head_dim || p.tail.block_size != cache.block_size || b.tail_slots == nullptr ||
        b.tail_ring_blocks < 1) {
      throw std::invalid_argument("kv_write (cuda): the window needs an FP8 pool, a bf16 tail with the pool's heads "
                                  "and block size, and tail_slots / tail_ring_blocks set");
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
  PagedKvView tail_check = p.tail;
  if (tail_check.v == nullptr) tail_check.v = tail_check.k;  // a K-only tail: only K's alignment matters
  const bool vec = cache.head_dim % kVec8 == 0 && vec8_ok(a.k, a.k_stride, row) && vec8_ok(a.v, a.v_stride, row) &&
                   pool_vec_ok(cache) && (!b.has_tail() || pool_vec_ok(tail_check));
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
