#pragma once
// The one FP8 E4M3FN codec of fp8serve, for host and device code.
//
// E4M3FN (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits; max finite 448; no infinities;
// NaN is S.1111.111. Encoding rounds to nearest, ties to even, and saturates: |x| > 448
// (infinities included) becomes ±448, NaN stays NaN (0x7F with the sign kept, as torch's and
// ml_dtypes' float8_e4m3fn do). For every non-NaN input this is bit-for-bit what CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) returns; CUDA's conversion gives 0x7F for a
// NaN of either sign, a difference no valid KV value can reach. Both backends encode with this
// codec (the CUDA kernels compile it for the device), so they write the same bits; the test
// tests/unit/fp8/test_fp8_codec.cpp checks every code and every rounding boundary.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8_HD __host__ __device__ __forceinline__
#else
#define FP8_HD inline
#endif

namespace fp8serve {

constexpr float kFp8E4m3Max = 448.0f;

FP8_HD uint32_t fp8_float_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

FP8_HD float fp8_bits_float(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

// Round-to-nearest-even of `value >> shift` (shift >= 1), the rounded-off bits compared with
// half of the last kept bit.
FP8_HD uint32_t fp8_rne_shift(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

FP8_HD uint8_t fp8_e4m3_encode(float x) {
  const uint32_t bits = fp8_float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7fu;  // NaN stays NaN
  if (abs_bits > 0x43e80000u) return sign | 0x7eu;  // beyond 464 = 448 + half an ulp: saturate
  const int exponent = static_cast<int>(abs_bits >> 23) - 127;
  const uint32_t significand = (abs_bits & 0x7fffffu) | 0x800000u;  // 1.m as a 24-bit integer
  if (exponent >= -6) {
    // Normal range: keep 3 mantissa bits; a carry out of the mantissa bumps the exponent,
    // which is exactly the next code.
    const uint32_t biased = static_cast<uint32_t>(exponent + 7);
    return sign | static_cast<uint8_t>((biased << 3) + fp8_rne_shift(significand, 20) - 8u);
  }
  if (exponent < -10) return sign;  // below half the smallest subnormal (2^-10): ±0
  // Subnormal range: units of 2^-9. 1.m * 2^e / 2^-9 = significand >> (14 - e).
  return sign | static_cast<uint8_t>(fp8_rne_shift(significand, static_cast<uint32_t>(14 - exponent)));
}

FP8_HD float fp8_e4m3_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return fp8_bits_float(sign | 0x7fc00000u);  // NaN
  float magnitude;
  if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * (1.0f / 512.0f);  // m * 2^-9
  } else {
    magnitude = fp8_bits_float(((exponent + 120u) << 23) | (mantissa << 20));  // 1.m * 2^(e-7)
  }
  return fp8_bits_float(fp8_float_bits(magnitude) | sign);
}

}  // namespace fp8serve
