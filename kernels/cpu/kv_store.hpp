#pragma once
// Row loads and stores shared by the CPU kv_write and kv_spill: one head's K or V row of one
// token in a pool of the layout of kernels/paged_kv.hpp. A K row's 4-byte groups sit block_size
// groups apart (group_stride), a V row is contiguous (pack = head_dim). The FP8 codecs run 16
// values at a time where the CPU has AVX-512F, bitwise the scalar ones.
#include <cstdint>
#include <cstring>

#include "kernels/kv_dtype.hpp"
#include "kernels/kv_scale_math.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/fp8_encode_avx512.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {

// How a row's values become the pool's elements.
enum class RowCodec {
  bf16,         // bf16(x): the bf16 pool and the window's tail
  fp8,          // fp8_e4m3_encode(x / scale): the FP8 pool without a window
  fp8_via_bf16  // fp8_e4m3_encode(bf16(x) / scale): the FP8 pool with a window (paged_kv.hpp)
};

// The FP8 codecs of store_row 16 values at a time (bitwise the scalar path: the same bf16
// rounding for fp8_via_bf16, the same division, fp8_encode_avx512.hpp's codec, the same
// saturation rule). PRECOND: head_dim % 16 == 0 and pack a multiple or a divisor of 16.
__attribute__((target("avx512f,popcnt"))) inline uint64_t store_row_fp8_avx512(const float* src, uint8_t* dst,
                                                                             int32_t head_dim, int32_t pack,
                                                                             int64_t group_stride, bool via_bf16,
                                                                             float scale) {
  uint64_t saturated = 0;
  const __m512 divisor = _mm512_set1_ps(scale);
  const __m512 limit = _mm512_set1_ps(kFp8SaturationThreshold);
  alignas(16) uint8_t codes[16];
  for (int32_t d = 0; d < head_dim; d += 16) {
    __m512 x = _mm512_loadu_ps(src + d);
    if (via_bf16) x = bf16_round16(x);
    const __m512 y = _mm512_div_ps(x, divisor);
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

// Element d of the row goes to pool + offset + (d / pack) * group_stride + d % pack. Returns the
// number of saturated elements (FP8 only).
inline uint64_t store_row(const float* src, void* pool, int64_t offset, int32_t head_dim, int32_t pack,
                          int64_t group_stride, RowCodec codec, float scale) {
  if (codec != RowCodec::bf16 && head_dim % 16 == 0 && (pack % 16 == 0 || 16 % pack == 0) &&
      cpu_features().avx512f) {
    return store_row_fp8_avx512(src, static_cast<uint8_t*>(pool) + offset, head_dim, pack, group_stride,
                                codec == RowCodec::fp8_via_bf16, scale);
  }
  auto value = [src](int32_t i) { return src[i]; };
  uint64_t saturated = 0;
  if (codec == RowCodec::bf16) {
    uint16_t* dst = static_cast<uint16_t*>(pool) + offset;
    for (int32_t g = 0; g < head_dim; g += pack, dst += group_stride) {
      for (int32_t i = 0; i < pack; ++i) dst[i] = bf16_encode(value(g + i));
    }
    return 0;
  }
  uint8_t* dst = static_cast<uint8_t*>(pool) + offset;
  for (int32_t g = 0; g < head_dim; g += pack, dst += group_stride) {
    for (int32_t i = 0; i < pack; ++i) {
      const float x = codec == RowCodec::fp8_via_bf16 ? bf16_decode(bf16_encode(value(g + i))) : value(g + i);
      // A division, as the contract says: x * (1 / scale) rounds differently.
      const float y = x / scale;
      dst[i] = fp8_e4m3_encode(y);
      saturated += kv_value_saturates(y) ? 1u : 0u;
    }
  }
  return saturated;
}

// The inverse for a bf16 pool (the tail): element d from pool + offset + (d / pack) *
// group_stride + d % pack, decoded.
inline void load_bf16_row(const void* pool, int64_t offset, int32_t head_dim, int32_t pack, int64_t group_stride,
                          float* out) {
  const uint16_t* src = static_cast<const uint16_t*>(pool) + offset;
  for (int32_t g = 0; g < head_dim; g += pack, src += group_stride) {
    for (int32_t i = 0; i < pack; ++i) out[g + i] = bf16_decode(src[i]);
  }
}

}  // namespace fp8serve::cpu
