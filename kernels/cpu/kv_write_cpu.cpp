#include "kernels/cpu/kv_write_cpu.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/fp8_encode_avx512.hpp"
#include "kernels/cpu/paged_kv_check.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {

namespace {

constexpr int32_t kTokensPerItem = 16;

bool calibrates(const PagedBatch& batch, int32_t seq) {
  return batch.calibrate != nullptr && batch.calibrate[seq] != 0;
}

// max |x| over the sequence's new tokens, all heads. NaN is skipped (a comparison with NaN is
// false); an infinity yields an infinite amax, which calibrate_kv_scale maps to FLT_MAX.
float chunk_amax(const float* x, int64_t token_stride, int32_t first, int32_t count, int32_t row) {
  float amax = 0.0f;
  for (int32_t t = first; t < first + count; ++t) {
    const float* src = x + t * token_stride;
    for (int32_t i = 0; i < row; ++i) {
      const float a = std::fabs(src[i]);
      if (a > amax) amax = a;
    }
  }
  return amax;
}

// Writes one head row of one token, element d at dst + (d / pack) * group_stride + d % pack
// (a V row: pack = head_dim; a K row: its 4-byte groups, block_size groups apart); returns the
// number of saturated elements.
template <class T, class Encode>
uint64_t store_row(const float* src, T* dst, int32_t head_dim, int32_t pack, int64_t group_stride,
                   Encode encode) {
  uint64_t saturated = 0;
  for (int32_t g = 0; g < head_dim; g += pack, dst += group_stride) {
    for (int32_t i = 0; i < pack; ++i) saturated += encode(src[g + i], dst[i]);
  }
  return saturated;
}

// The FP8 case of store_row 16 values at a time (bitwise the scalar path: the same division,
// fp8_encode_avx512.hpp's codec, the same saturation rule). PRECOND: head_dim % 16 == 0 and pack
// a multiple or a divisor of 16.
__attribute__((target("avx512f,popcnt"))) uint64_t store_row_fp8_avx512(const float* src, uint8_t* dst, int32_t head_dim,
                                                                      int32_t pack, int64_t group_stride, float scale) {
  uint64_t saturated = 0;
  const __m512 divisor = _mm512_set1_ps(scale);
  const __m512 limit = _mm512_set1_ps(kFp8SaturationThreshold);
  alignas(16) uint8_t codes[16];
  for (int32_t d = 0; d < head_dim; d += 16) {
    const __m512 y = _mm512_div_ps(_mm512_loadu_ps(src + d), divisor);
    const __m512 magnitude = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(0x7fffffff)));
    saturated += static_cast<uint64_t>(_mm_popcnt_u32(_mm512_cmp_ps_mask(magnitude, limit, _CMP_GT_OQ)));
    _mm_store_si128(reinterpret_cast<__m128i*>(codes), fp8_e4m3_encode16(y));
    if (pack % 16 == 0) {
      std::memcpy(dst + (d / pack) * group_stride + d % pack, codes, 16);
    } else {
      for (int32_t g = 0; g < 16; g += pack) {
        std::memcpy(dst + ((d + g) / pack) * group_stride, codes + g, static_cast<std::size_t>(pack));
      }
    }
  }
  return saturated;
}

uint64_t store_row(const float* src, void* pool, int64_t offset, int32_t head_dim, int32_t pack,
                   int64_t group_stride, KvDtype dtype, float scale) {
  if (dtype == KvDtype::bf16) {
    return store_row(src, static_cast<uint16_t*>(pool) + offset, head_dim, pack, group_stride,
                     [](float x, uint16_t& out) {
                       out = bf16_encode(x);
                       return 0u;
                     });
  }
  if (head_dim % 16 == 0 && (pack % 16 == 0 || 16 % pack == 0) && cpu_features().avx512f) {
    return store_row_fp8_avx512(src, static_cast<uint8_t*>(pool) + offset, head_dim, pack, group_stride, scale);
  }
  return store_row(src, static_cast<uint8_t*>(pool) + offset, head_dim, pack, group_stride,
                   [scale](float x, uint8_t& out) {
                     // A division, as the contract says: x * (1 / scale) rounds differently.
                     const float y = x / scale;
                     out = fp8_e4m3_encode(y);
                     return kv_value_saturates(y) ? 1u : 0u;
                   });
}

}  // namespace

void validate_kv_write(const KvWriteParams& params) {
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  validate_paged_kv_view(cache);
  validate_query_starts(batch);
  if (batch.has_tail()) {
    throw std::invalid_argument("the bf16 recent window (PagedBatch::fp8_lens) is not implemented by the CPU kernels yet");
  }
  if (batch.num_tokens == 0) return;
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  auto bad_stride = [row](int64_t stride) { return stride != 0 && stride < row; };
  if (params.k == nullptr || params.v == nullptr || bad_stride(params.k_token_stride) ||
      bad_stride(params.v_token_stride)) {
    throw std::invalid_argument("kv_write: null k/v or token stride (not 0) < num_kv_heads * head_dim");
  }
  if (batch.slot_mapping == nullptr) throw std::invalid_argument("kv_write: null slot_mapping");
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (int32_t t = 0; t < batch.num_tokens; ++t) {
    if (batch.slot_mapping[t] >= num_slots) {
      throw std::invalid_argument("kv_write: token " + std::to_string(t) + " has slot " +
                                  std::to_string(batch.slot_mapping[t]) + ", pool has " +
                                  std::to_string(num_slots));
    }
  }
  if (cache.dtype != KvDtype::fp8_e4m3) return;
  if (batch.k_scales == nullptr || batch.v_scales == nullptr) {
    throw std::invalid_argument("kv_write: FP8 pool needs k_scales and v_scales");
  }
  bool any_calibrates = false;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    if (calibrates(batch, s)) {
      any_calibrates = true;
      continue;
    }
    const float k = batch.k_scales[s];
    const float v = batch.v_scales[s];
    if (!(k > 0.0f && k <= FLT_MAX && v > 0.0f && v <= FLT_MAX)) {
      throw std::invalid_argument("kv_write: sequence " + std::to_string(s) +
                                  " has a frozen scale that is not finite and > 0");
    }
  }
  if (any_calibrates) validate_kv_scale_margin(params.scale_margin);
}

void kv_write_cpu(const KvWriteParams& given, ThreadPool& pool) {
  validate_kv_write(given);
  KvWriteParams params = given;
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  const int32_t row = cache.num_kv_heads * cache.head_dim;
  if (params.k_token_stride == 0) params.k_token_stride = row;
  if (params.v_token_stride == 0) params.v_token_stride = row;
  const float* k = static_cast<const float*>(params.k);
  const float* v = static_cast<const float*>(params.v);
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  const int32_t k_pack = kv_k_pack(cache.dtype);
  const int64_t k_group_stride = static_cast<int64_t>(cache.block_size) * k_pack;

  if (fp8 && batch.calibrate != nullptr) {
    // Calibrate before any token is quantized: every token of the chunk uses the new scale.
    pool.parallel_for(batch.num_seqs, [&](int64_t i) {
      const int32_t s = static_cast<int32_t>(i);
      if (!calibrates(batch, s)) return;
      const int32_t first = batch.query_start_loc[s];
      const int32_t count = batch.num_new_tokens(s);
      batch.k_scales[s] = calibrate_kv_scale(chunk_amax(k, params.k_token_stride, first, count, row), params.scale_margin);
      batch.v_scales[s] = calibrate_kv_scale(chunk_amax(v, params.v_token_stride, first, count, row), params.scale_margin);
    });
  }

  const int64_t num_items = (batch.num_tokens + kTokensPerItem - 1) / kTokensPerItem;
  std::vector<KvWriteCounts> item_counts(static_cast<std::size_t>(num_items));
  pool.parallel_for(num_items, [&](int64_t item) {
    const int32_t begin = static_cast<int32_t>(item) * kTokensPerItem;
    const int32_t end = std::min(batch.num_tokens, begin + kTokensPerItem);
    // The sequence owning token `begin`: the last s with query_start_loc[s] <= begin.
    int32_t seq = static_cast<int32_t>(
        std::upper_bound(batch.query_start_loc, batch.query_start_loc + batch.num_seqs + 1, begin) -
        batch.query_start_loc) - 1;
    KvWriteCounts& counts = item_counts[static_cast<std::size_t>(item)];
    for (int32_t t = begin; t < end; ++t) {
      while (batch.query_start_loc[seq + 1] <= t) ++seq;
      const int64_t slot = batch.slot_mapping[t];
      if (slot < 0) continue;  // padding token: no cache slot
      const float k_scale = fp8 ? batch.k_scales[seq] : 1.0f;
      const float v_scale = fp8 ? batch.v_scales[seq] : 1.0f;
      for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
        const int64_t src = static_cast<int64_t>(h) * cache.head_dim;
        counts.num_k_saturated += store_row(k + t * params.k_token_stride + src, cache.k, cache.k_offset(slot, h, 0),
                                            cache.head_dim, k_pack, k_group_stride, cache.dtype, k_scale);
        counts.num_v_saturated += store_row(v + t * params.v_token_stride + src, cache.v, cache.v_offset(slot, h),
                                            cache.head_dim, cache.head_dim, 0, cache.dtype, v_scale);
      }
      counts.num_elements += static_cast<uint64_t>(row);
    }
  });
  if (params.counts != nullptr) {
    for (const KvWriteCounts& c : item_counts) *params.counts += c;
  }
}

}  // namespace fp8serve::cpu
