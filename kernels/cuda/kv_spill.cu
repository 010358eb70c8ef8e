// kv_spill on the GPU (kernels/kv_spill.hpp, from the bf16 window's branch): the positions that
// leave a sequence's bf16 recent window move from the tail into their FP8 slots, quantized with
// the sequence's frozen scales - the same division and codec as kv_write (kv_store.cuh), so a
// token's FP8 bytes do not depend on which of the two wrote them - and counted the same way.
//
// Launch: grid (position tiles, sequences), 256 threads; a tile holds whole positions (all KV
// heads), a thread moves 8 elements of one head: four 4-byte loads of the tail's K groups and
// one 16-byte load of its V row, two 4-byte stores of FP8 K groups and one 8-byte V store. A
// sequence whose range is shorter than the grid's leaves early (the usual decode step spills
// nothing). A block id outside the pool raises kErrorSlot and is skipped.
#include <stdexcept>

#include "kernels/cuda/kv_store.cuh"
#include "kernels/kv_spill.hpp"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTilePositions = 64;

struct SpillArgs {
  KvSpillParams p;
  int32_t vecs_per_head;
  int32_t tile_positions;
  unsigned* errors;
};

template <int kVec>
__global__ void __launch_bounds__(kThreads) kv_spill_kernel(const SpillArgs a) {
  const PagedBatch& b = a.p.batch;
  const PagedKvView& cache = a.p.cache;
  const PagedKvView& tail = a.p.tail;
  const int32_t s = static_cast<int32_t>(blockIdx.y);
  const int32_t context_before = b.context_lens[s] - b.num_new_tokens(s);
  const int32_t start = a.p.spill_starts[s];
  int32_t end = b.fp8_lens[s] < context_before ? b.fp8_lens[s] : context_before;
  if (end - start > a.p.max_spill_tokens) end = start + a.p.max_spill_tokens;
  const int32_t first = start + static_cast<int32_t>(blockIdx.x) * a.tile_positions;
  const int32_t count = end - first < a.tile_positions ? end - first : a.tile_positions;
  const int32_t items = cache.num_kv_heads * a.vecs_per_head;
  const int32_t bs = cache.block_size;
  const float k_scale = b.k_scales[s];
  const float v_scale = b.v_scales[s];
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  unsigned long long k_elements = 0, v_elements = 0, k_sat = 0, v_sat = 0;
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < count * items; i += static_cast<int32_t>(blockDim.x)) {
    const int32_t pos = first + i / items;
    const int32_t item = i % items;
    const int32_t head = item / a.vecs_per_head;
    const int32_t d = (item - head * a.vecs_per_head) * kVec;
    const int32_t logical = pos / bs;
    const int32_t block = pos >= 0 && logical < b.max_blocks_per_seq ? b.block_table(s)[logical] : -1;
    if (block < 0 || block >= cache.num_blocks) {
      if (item == 0) raise_error(a.errors, kErrorSlot);
      continue;
    }
    const int64_t to = static_cast<int64_t>(block) * bs + pos % bs;
    const int64_t from = b.tail_slot(s, pos, bs);
    std::uint16_t x[kVec];
    load_k_bf16<kVec>(tail, from, head, d, x);
    k_sat += store_k_fp8<kVec>(cache, to, head, d, x, k_scale);
    if (tail.v != nullptr) {  // else a K-only window: V went to the pool when written
      load_v_bf16<kVec>(tail, from, head, d, x);
      v_sat += store_v_fp8<kVec>(cache, to, head, d, x, v_scale);
    }
    if (item == 0) {
      k_elements += static_cast<unsigned long long>(row);
      if (tail.v != nullptr) v_elements += static_cast<unsigned long long>(row);
    }
  }
  if (a.p.counts != nullptr) add_counts(a.p.counts, k_elements, v_elements, k_sat, v_sat);
}

}  // namespace

void kv_spill_cuda(const KvSpillParams& p, unsigned* errors, cudaStream_t stream) {
  const PagedKvView& cache = p.cache;
  const PagedKvView& tail = p.tail;
  const PagedBatch& b = p.batch;
  if (p.max_spill_tokens < 0) throw std::invalid_argument("kv_spill (cuda): negative max_spill_tokens");
  if (p.max_spill_tokens == 0 || b.num_seqs == 0) return;
  if (!b.has_tail() || b.tail_slots == nullptr || b.tail_ring_blocks < 1 || p.spill_starts == nullptr ||
      b.block_tables == nullptr || b.context_lens == nullptr || b.query_start_loc == nullptr ||
      b.k_scales == nullptr || b.v_scales == nullptr || b.num_seqs < 0 || b.num_seqs > 65535) {
    throw std::invalid_argument("kv_spill (cuda): needs the window's fields, spill_starts, block tables and scales");
  }
  if (cache.dtype != KvDtype::fp8_e4m3 || tail.dtype != KvDtype::bf16 || cache.k == nullptr || cache.v == nullptr ||
      tail.k == nullptr || tail.num_kv_heads != cache.num_kv_heads || tail.head_dim != cache.head_dim ||
      tail.block_size != cache.block_size || cache.head_dim % kv_k_pack(KvDtype::fp8_e4m3) != 0) {
    throw std::invalid_argument("kv_spill (cuda): needs an FP8 pool and a bf16 tail of the same geometry");
  }
  PagedKvView tail_check = tail;
  if (tail_check.v == nullptr) tail_check.v = tail_check.k;
  const bool vec = cache.head_dim % kVec8 == 0 && pool_vec_ok(cache) && pool_vec_ok(tail_check);
  SpillArgs a{p, 0, 0, errors};
  const int kVec = vec ? kVec8 : 1;
  a.vecs_per_head = cache.head_dim / kVec;
  const int64_t items = static_cast<int64_t>(cache.num_kv_heads) * a.vecs_per_head;
  const int64_t tile = kThreads / items;
  a.tile_positions = static_cast<int32_t>(tile < 1 ? 1 : (tile > kMaxTilePositions ? kMaxTilePositions : tile));
  const dim3 grid(static_cast<unsigned>(div_up(p.max_spill_tokens, a.tile_positions)), static_cast<unsigned>(b.num_seqs));
  if (vec) {
    FP8SERVE_LAUNCH((kv_spill_kernel<kVec8>), grid, dim3(kThreads), 0, stream, a);
  } else {
    FP8SERVE_LAUNCH((kv_spill_kernel<1>), grid, dim3(kThreads), 0, stream, a);
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
