#pragma once
// The pieces the two AVX-512 linear kernels share (linear_avx512.cpp: the fp32 dot;
// linear_avx512bf16.cpp: the bf16 dot): the end of a block of a tile (kernels/cpu/linear.hpp:
// FP8 partial sums folded into the totals with their scale) and the canonical halving tree.
// Not a normal header: include it only from those two files, after <immintrin.h>.
#include <cstdint>

#include "kernels/cpu/linear_tiles.hpp"

#define FP8SERVE_AVX512_LINEAR __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace fp8serve::cpu::detail {
namespace {

// The canonical halving tree: (j + j+8), (j + j+4), (j + j+2), (j + j+1).
FP8SERVE_AVX512_LINEAR inline float reduce16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

template <int R, int C>
FP8SERVE_AVX512_LINEAR inline void zero_tile(__m512 (&acc)[R][C]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
}

// End of block b of an R x C tile: FP8 weights fold the block's partial sums into the totals,
// total = fma(partial, scale * scale_factor, total) from total = +0; bf16 weights have one block,
// whose partial sums are the totals.
template <bool kScaled, int R, int C>
FP8SERVE_AVX512_LINEAR inline void end_block(const float* const* scales, int64_t b, float scale_factor,
                                             const __m512 (&acc)[R][C], __m512 (&total)[R][C]) {
  if constexpr (kScaled) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 scale = _mm512_set1_ps(scales[c][b] * scale_factor);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        total[r][c] = _mm512_fmadd_ps(acc[r][c], scale, b == 0 ? _mm512_setzero_ps() : total[r][c]);
      }
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) total[r][c] = acc[r][c];
    }
  }
}

// dots[r * C + c] = the tree of total[r][c].
template <int R, int C>
FP8SERVE_AVX512_LINEAR inline void reduce_tile(const __m512 (&total)[R][C], float* dots) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) dots[r * C + c] = reduce16(total[r][c]);
  }
}

}  // namespace
}  // namespace fp8serve::cpu::detail
