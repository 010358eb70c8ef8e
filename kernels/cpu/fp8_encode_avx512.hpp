#pragma once
// fp8_e4m3_encode (kernels/fp8.hpp), and bf16_encode (kernels/bf16.hpp) on its way to it, on 16
// floats at a time, bitwise the same (tested on every rounding boundary against the scalar
// codecs): the KV write quantizes every new token's K and V, 2 x num_kv_heads x head_dim values
// per layer, where the scalar codec and its division took ~100 us of a batch-1 decode step of
// SmolLM2. Callers must run on a CPU with AVX-512F.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 (_mm512_undefined_*)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#define FP8SERVE_TARGET_AVX512F __attribute__((target("avx512f")))

namespace fp8serve::cpu {

// Round to nearest even of v >> shift, per lane (1 <= shift <= 31).
FP8SERVE_TARGET_AVX512F inline __m512i fp8_rne_shift16(__m512i v, __m512i shift) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i kept = _mm512_srlv_epi32(v, shift);
  const __m512i rest = _mm512_and_si512(v, _mm512_sub_epi32(_mm512_sllv_epi32(one, shift), one));
  const __m512i half = _mm512_sllv_epi32(one, _mm512_sub_epi32(shift, one));
  const __mmask16 up = _mm512_cmpgt_epi32_mask(rest, half) |
                       (_mm512_cmpeq_epi32_mask(rest, half) & _mm512_test_epi32_mask(kept, one));
  return _mm512_mask_add_epi32(kept, up, kept, one);
}

// 16 floats -> 16 E4M3 codes: round to nearest even, |x| > 464 (and infinities) to +-448, NaN
// to NaN with its sign.
FP8SERVE_TARGET_AVX512F inline __m128i fp8_e4m3_encode16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
  const __m512i exponent = _mm512_sub_epi32(_mm512_srli_epi32(abs, 23), _mm512_set1_epi32(127));
  const __m512i significand =
      _mm512_or_si512(_mm512_and_si512(abs, _mm512_set1_epi32(0x7fffff)), _mm512_set1_epi32(0x800000));
  // Normal range (exponent >= -6): 3 mantissa bits kept, the carry bumps the exponent. Subnormal
  // (-10 <= exponent < -6): units of 2^-9, significand >> (14 - exponent). Below: zero.
  const __mmask16 normal = _mm512_cmpge_epi32_mask(exponent, _mm512_set1_epi32(-6));
  const __mmask16 zero = _mm512_cmplt_epi32_mask(exponent, _mm512_set1_epi32(-10));
  const __m512i shift = _mm512_mask_blend_epi32(normal, _mm512_sub_epi32(_mm512_set1_epi32(14), exponent),
                                                _mm512_set1_epi32(20));
  const __m512i rounded = fp8_rne_shift16(significand, _mm512_min_epi32(shift, _mm512_set1_epi32(31)));
  const __m512i normal_code = _mm512_add_epi32(
      _mm512_slli_epi32(_mm512_add_epi32(exponent, _mm512_set1_epi32(7)), 3), _mm512_sub_epi32(rounded, _mm512_set1_epi32(8)));
  __m512i code = _mm512_mask_blend_epi32(normal, rounded, normal_code);
  code = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~zero), code);
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x43e80000)),
                               _mm512_set1_epi32(0x7e));
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000)),
                               _mm512_set1_epi32(0x7f));
  return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

// bf16_encode (kernels/bf16.hpp) on the 16 floats whose bits are `bits`: each 32-bit lane holds
// the bf16 code in its low half. The same integer rounding (round half to even by adding 0x7fff +
// the lowest kept bit), NaN quieted with its sign.
FP8SERVE_TARGET_AVX512F inline __m512i bf16_encode16(__m512i bits) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40)));
}

// bf16_decode(bf16_encode(x)) per lane: x rounded to bf16, as the window's FP8 writes take it.
FP8SERVE_TARGET_AVX512F inline __m512 bf16_round16(__m512 x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_encode16(_mm512_castps_si512(x)), 16));
}

// out[i] = fp8_e4m3_encode(in[i]) for i < 16.
FP8SERVE_TARGET_AVX512F inline void fp8_e4m3_encode16(const float* in, uint8_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), fp8_e4m3_encode16(_mm512_loadu_ps(in)));
}

}  // namespace fp8serve::cpu
