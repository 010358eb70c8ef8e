// Paged attention work item, AVX2 + FMA build (8 lanes). Everything defined between the target
// push and pop is compiled for AVX2; standard headers are included before it so none of their
// inline functions is emitted with AVX2 instructions (the linker could pick that copy for
// everybody). Called only when cpu_features() reports avx2, fma and f16c.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cpu/attention_item.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace fp8serve::cpu {
namespace {

struct VecAvx2 {
  using Reg = __m256;
  static constexpr int W = 8;
  static constexpr int kNumRegs = 16;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg x) { _mm256_storeu_ps(p, x); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static float reduce_add(Reg x) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
  }
  static float reduce_max(Reg x) {
    __m128 v = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    v = _mm_max_ps(v, _mm_movehl_ps(v, v));
    v = _mm_max_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
  }
  // 2^x = 2^n * 2^f, n = round(x), |f| <= 1/2, 2^f by the polynomial kExp2Poly (error
  // < 1e-8 relative, below float rounding). x < -126 gives 0: -inf is a masked key.
  static Reg exp2(Reg x) {
    const Reg xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
    const Reg n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const Reg f = _mm256_sub_ps(xc, n);
    Reg p = _mm256_set1_ps(kExp2Poly[0]);
#pragma GCC unroll 8
    for (int i = 1; i < kExp2PolyTerms; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const Reg result = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(result, _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ));
  }
  // FP8 E4M3 -> fp32 without a table and without fp32 denormals (an FP8 subnormal built as
  // an fp32 denormal and scaled up costs a microcode assist per vector: 2x slower on this
  // AMD EPYC). Sign-extend each byte to 16 bits and shift it left by 7: sign, then the 4
  // exponent and 3 mantissa bits land where fp16 keeps them (the stray copy of the sign in
  // bit 14 is masked off). That fp16 is the E4M3 value times 2^-8, subnormals included - fp16
  // has them too, and the hardware conversion handles them at full speed. The 2^8 is folded
  // into the scales (kFp8Unit). The NaN code (never stored except for NaN input) reads as
  // ±480.
  static constexpr float kFp8Unit = 256.0f;
  static Reg load_kv(const uint8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    __m128i halves = _mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7);
    halves = _mm_and_si128(halves, _mm_set1_epi16(static_cast<short>(0xbf80)));
    return _mm256_cvtph_ps(halves);
  }
  static Reg load_kv(const uint16_t* p) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  }

  // 8 keys' 4-byte K groups (one per 32-bit lane; lanes >= `lanes` read as 0).
  static __m256i load_groups(const void* p, int lanes) {
    if (lanes >= W) return _mm256_loadu_si256(static_cast<const __m256i*>(p));
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_epi32(static_cast<const int*>(p), mask);
  }
  // FP8: the fp16 trick of load_kv on each byte of a 16-bit word: an arithmetic shift right by
  // one puts the high byte's sign in bits 15 and 14 and its magnitude in bits 13..7 (the mask
  // clears bit 14 and the low byte's bits); the low byte is moved up first. Then one byte
  // shuffle and one 64-bit permute gather each element's 8 halves for the conversion.
  static void load_k_group(const uint8_t* p, int lanes, Reg (&out)[4]) {
    const __m256i x = load_groups(p, lanes);
    const __m256i mask = _mm256_set1_epi16(static_cast<short>(0xbf80));
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(x, 8), 1), mask);  // bytes 0, 2
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(x, 1), mask);                         // bytes 1, 3
    // Per 128-bit lane: the low halves of the 4 dwords, then the high halves.
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i e = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(even, split), 0xd8);
    const __m256i o = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(odd, split), 0xd8);
    out[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(e));
    out[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(o));
    out[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(e, 1));
    out[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(o, 1));
  }
  // bf16: each lane holds two elements; the low one moves up, the high one is masked.
  static void load_k_group(const uint16_t* p, int lanes, Reg (&out)[2]) {
    const __m256i x = load_groups(p, lanes);
    out[0] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    out[1] = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

}  // namespace
}  // namespace fp8serve::cpu

#include "kernels/cpu/attention_tile_impl.hpp"

namespace fp8serve::cpu {

void attend_item_avx2(const AttentionItem& item) { tile::attend_item_dispatch<VecAvx2>(item); }

}  // namespace fp8serve::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
