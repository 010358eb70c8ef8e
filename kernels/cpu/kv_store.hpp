#pragma once
// Row loads and stores shared by the CPU kv_write and kv_spill: one head's K or V row of one
// token in a pool of the layout of kernels/paged_kv.hpp. A K row's 4-byte groups sit block_size
// groups apart (group_stride), a V row is contiguous (pack = head_dim).
#include <cstdint>

#include "cache/kv_dtype.hpp"
#include "cache/kv_scales.hpp"
#include "kernels/bf16.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {

// How a row's values become the pool's elements.
enum class RowCodec {
  bf16,         // bf16(x): the bf16 pool and the window's tail
  fp8,          // fp8_e4m3_encode(x / scale): the FP8 pool without a window
  fp8_via_bf16  // fp8_e4m3_encode(bf16(x) / scale): the FP8 pool with a window (paged_kv.hpp)
};

// Element d of the row goes to pool + offset + (d / pack) * group_stride + d % pack. Returns the
// number of saturated elements (FP8 only).
inline uint64_t store_row(const float* src, void* pool, int64_t offset, int32_t head_dim, int32_t pack,
                          int64_t group_stride, RowCodec codec, float scale) {
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
