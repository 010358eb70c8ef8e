#pragma once
// E4M3 -> bf16 in AVX-512 registers, shared by the bf16-dot attention and linear kernels: a
// 128-entry table lookup on the 7 magnitude bits (vpermt2b, two tables for the high and the low
// byte of the bf16 bits) plus the sign bit, then the bytes interleaved into words within each
// 128-bit lane. Every E4M3 value is a bf16 number, so the conversion is exact. Callers must run
// on a CPU with AVX512-VBMI (cpu_features()).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 (_mm512_undefined_*)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {

// bf16 bits of E4M3 magnitude m (0..127): high bytes in [0, 128), low bytes in [128, 256).
struct Fp8Bf16Table {
  alignas(64) uint8_t bytes[256];
  Fp8Bf16Table() {
    for (int m = 0; m < 128; ++m) {
      const uint16_t bits = bf16_encode(fp8_e4m3_decode(static_cast<uint8_t>(m)));  // exact
      bytes[m] = static_cast<uint8_t>(bits >> 8);
      bytes[128 + m] = static_cast<uint8_t>(bits & 0xff);
    }
  }
};
inline const Fp8Bf16Table kFp8Bf16Table;

#define FP8SERVE_TARGET_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

// The table in registers, loaded once per kernel call.
struct Fp8Bf16Lut {
  __m512i hi0, hi1, lo0, lo1, sign;
};

FP8SERVE_TARGET_AVX512VBMI inline Fp8Bf16Lut fp8_bf16_lut() {
  const uint8_t* t = kFp8Bf16Table.bytes;
  return {_mm512_load_si512(t), _mm512_load_si512(t + 64), _mm512_load_si512(t + 128),
          _mm512_load_si512(t + 192), _mm512_set1_epi8(static_cast<char>(0x80))};
}

// 64 FP8 bytes -> 32 bf16 in w0 (bytes 0..7 of each 128-bit lane) and 32 in w1 (bytes 8..15):
// word p of w0 is byte 16 (p / 8) + p % 8, word p of w1 byte 16 (p / 8) + 8 + p % 8.
FP8SERVE_TARGET_AVX512VBMI inline void fp8_to_bf16(__m512i bytes, const Fp8Bf16Lut& t, __m512i& w0,
                                                   __m512i& w1) {
  // hi | (bytes & 0x80): the table's high byte with the FP8 sign put back.
  const __m512i hi =
      _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, bytes, t.hi1), bytes, t.sign, 0xf8);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, bytes, t.lo1);
  w0 = _mm512_unpacklo_epi8(lo, hi);
  w1 = _mm512_unpackhi_epi8(lo, hi);
}

}  // namespace fp8serve::cpu
