#pragma once
// Device loads and stores of one head's K or V row piece in a pool of kernels/paged_kv.hpp's
// layout, shared by kv_write.cu and kv_spill.cu. A thread moves kVec consecutive elements
// (d .. d + kVec - 1) of one (slot, head): for kVec = 8, a K piece is 8 / P groups of 4 bytes
// (P = 4 for FP8, 2 for bf16), block_size groups apart; a V piece is 8 contiguous elements (one
// 8-byte store for FP8, 16 bytes for bf16). kVec = 1 is the element-at-a-time fallback.
// PRECOND for kVec = 8: d % 8 == 0 and the view passes pool_vec_ok().
#include <cstdint>

#include "kernels/kv_scale_math.hpp"
#include "kernels/cuda/device_util.cuh"


namespace fp8serve::cuda {

// 16-byte pieces need aligned bases and strides that are multiples of 8 elements.
inline bool pool_vec_ok(const PagedKvView& view) {
  return aligned_to(view.k, 16) && aligned_to(view.v, 16) && view.block_stride % 8 == 0 && view.head_stride % 8 == 0 &&
         view.v_token_stride % 8 == 0;
}

// Two floats to two E4M3 codes (a in the low byte): the hardware conversion
// (cvt.rn.satfinite.e4m3x2.f32, ptx.cuh), bit-identical to kernels/fp8.hpp's codec for every
// non-NaN value (tests/unit/gpu/test_fp8_codec_gpu.cpp).
FP8SERVE_DEVICE uint32_t encode_fp8x2(float a, float b) { return ptx::cvt_e4m3x2_f32(a, b); }

// kVec bf16 bits from contiguous activations.
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

FP8SERVE_DEVICE uint32_t pack_bits(std::uint16_t lo, std::uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// ---- bf16 pools (the bf16 KV pool, the window's tail) ------------------------------------------

template <int kVec>
FP8SERVE_DEVICE void store_k_bf16(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                  const std::uint16_t (&x)[kVec]) {
  auto* pool = static_cast<std::uint16_t*>(view.k);
  if constexpr (kVec == 8) {
    FP8SERVE_UNROLL
    for (int g = 0; g < 4; ++g) {
      *reinterpret_cast<uint32_t*>(pool + view.k_offset(slot, head, d + 2 * g)) = pack_bits(x[2 * g], x[2 * g + 1]);
    }
  } else {
    pool[view.k_offset(slot, head, d)] = x[0];
  }
}

template <int kVec>
FP8SERVE_DEVICE void store_v_bf16(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                  const std::uint16_t (&x)[kVec]) {
  std::uint16_t* dst = static_cast<std::uint16_t*>(view.v) + view.v_offset(slot, head) + d;
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack_bits(x[0], x[1]), pack_bits(x[2], x[3]), pack_bits(x[4], x[5]),
                                                pack_bits(x[6], x[7]));
  } else {
    dst[0] = x[0];
  }
}

template <int kVec>
FP8SERVE_DEVICE void load_k_bf16(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                 std::uint16_t (&x)[kVec]) {
  const auto* pool = static_cast<const std::uint16_t*>(view.k);
  if constexpr (kVec == 8) {
    FP8SERVE_UNROLL
    for (int g = 0; g < 4; ++g) {
      const uint32_t word = *reinterpret_cast<const uint32_t*>(pool + view.k_offset(slot, head, d + 2 * g));
      x[2 * g] = static_cast<std::uint16_t>(word & 0xffffu);
      x[2 * g + 1] = static_cast<std::uint16_t>(word >> 16);
    }
  } else {
    x[0] = pool[view.k_offset(slot, head, d)];
  }
}

template <int kVec>
FP8SERVE_DEVICE void load_v_bf16(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                 std::uint16_t (&x)[kVec]) {
  load_bits<kVec>(static_cast<const std::uint16_t*>(view.v) + view.v_offset(slot, head) + d, x);
}

// ---- the FP8 pool --------------------------------------------------------------------------------

// q = E4M3(x / scale), an IEEE division; returns how many |x / scale| > 464 (kernels/kv_scale_math.hpp).
template <int kVec>
FP8SERVE_DEVICE unsigned quantize(const std::uint16_t (&x)[kVec], float scale, uint8_t (&codes)[kVec]) {
  if constexpr (kVec == 1) {
    const float y = div_rn(bf16_decode(x[0]), scale);
    codes[0] = static_cast<uint8_t>(encode_fp8x2(y, 0.0f) & 0xffu);
    return kv_value_saturates(y) ? 1u : 0u;
  } else {
    unsigned saturated = 0;
    FP8SERVE_UNROLL
    for (int i = 0; i < kVec; i += 2) {
      const float y0 = div_rn(bf16_decode(x[i]), scale);
      const float y1 = div_rn(bf16_decode(x[i + 1]), scale);
      const uint32_t pair = encode_fp8x2(y0, y1);
      codes[i] = static_cast<uint8_t>(pair & 0xffu);
      codes[i + 1] = static_cast<uint8_t>(pair >> 8);
      saturated += (kv_value_saturates(y0) ? 1u : 0u) + (kv_value_saturates(y1) ? 1u : 0u);
    }
    return saturated;
  }
}

FP8SERVE_DEVICE uint32_t pack_codes(const uint8_t* c) {
  return static_cast<uint32_t>(c[0]) | (static_cast<uint32_t>(c[1]) << 8) | (static_cast<uint32_t>(c[2]) << 16) |
         (static_cast<uint32_t>(c[3]) << 24);
}

template <int kVec>
FP8SERVE_DEVICE unsigned store_k_fp8(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                     const std::uint16_t (&x)[kVec], float scale) {
  uint8_t codes[kVec];
  const unsigned saturated = quantize<kVec>(x, scale, codes);
  auto* pool = static_cast<uint8_t*>(view.k);
  if constexpr (kVec == 8) {
    FP8SERVE_UNROLL
    for (int g = 0; g < 2; ++g) {
      *reinterpret_cast<uint32_t*>(pool + view.k_offset(slot, head, d + 4 * g)) = pack_codes(codes + 4 * g);
    }
  } else {
    pool[view.k_offset(slot, head, d)] = codes[0];
  }
  return saturated;
}

template <int kVec>
FP8SERVE_DEVICE unsigned store_v_fp8(const PagedKvView& view, int64_t slot, int32_t head, int32_t d,
                                     const std::uint16_t (&x)[kVec], float scale) {
  uint8_t codes[kVec];
  const unsigned saturated = quantize<kVec>(x, scale, codes);
  uint8_t* dst = static_cast<uint8_t*>(view.v) + view.v_offset(slot, head) + d;
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_codes(codes), pack_codes(codes + 4));
  } else {
    dst[0] = codes[0];
  }
  return saturated;
}

// ---- counts --------------------------------------------------------------------------------------

// Adds a warp's totals to the layer's KvWriteCounts (one atomic per field per warp). PRECOND:
// every lane of the warp calls it. A template so that the branch below compiles without the
// field it names.
template <class Counts>
FP8SERVE_DEVICE void add_counts(Counts* counts, unsigned long long k_elements, unsigned long long v_elements,
                                unsigned long long k_saturated, unsigned long long v_saturated) {
  k_elements = warp_sum_u64(k_elements);
  v_elements = warp_sum_u64(v_elements);
  k_saturated = warp_sum_u64(k_saturated);
  v_saturated = warp_sum_u64(v_saturated);
  if (threadIdx.x % kWarpSize != 0) return;
  auto add = [](uint64_t& field, unsigned long long value) {
    if (value) atomicAdd(reinterpret_cast<unsigned long long*>(&field), value);
  };
  add(counts->num_elements, k_elements);
  add(counts->num_k_saturated, k_saturated);
  add(counts->num_v_saturated, v_saturated);
  // The bf16 window's branch adds num_v_elements (V rows written to the pool, which a K-only
  // window makes differ from K's); until it is merged the field does not exist.
  if constexpr (requires(Counts c) { c.num_v_elements; }) add(counts->num_v_elements, v_elements);
}

}  // namespace fp8serve::cuda
