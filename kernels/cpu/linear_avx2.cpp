// The AVX2 fp32-dot linear kernel: the same 16-lane partial sums as every fp32 path
// (kernels/cpu/linear.hpp), held as two ymm registers (lanes 0-7 and 8-15), so results are
// bitwise those of the scalar and AVX-512 paths. Register tiles of R tokens x C weight rows fit
// the 16 ymm registers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see linear_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/linear_tiles.hpp"
#include "kernels/cpu/ops.hpp"

#define FP8SERVE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace fp8serve::cpu::detail {

namespace {

// 2 x 3 tiles: 12 accumulators + 2 widened weight halves; activations come from memory.
constexpr int kRows = 2;
constexpr int kCols = 3;
constexpr int kPrefetchTiles = 4;  // see linear_avx512.cpp
constexpr int64_t kGemvPrefetchRows = 4;

// 8 weights -> 8 fp32, exactly (see linear_avx512.cpp for the FP8 fp16 trick).
FP8SERVE_AVX2 inline __m256 widen8(const std::uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
FP8SERVE_AVX2 inline __m256 widen8(const std::uint8_t* w) {
  __m128i halves = _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))), 7);
  halves = _mm_and_si128(halves, _mm_set1_epi16(static_cast<short>(0xbf80)));
  return _mm256_cvtph_ps(halves);
}

// The canonical halving tree, starting from lanes 0-7 (lo) and 8-15 (hi).
FP8SERVE_AVX2 inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

template <typename W, int R, int C>
FP8SERVE_AVX2 inline void step(const float* const (&x)[R], const W* const (&w)[C], __m256 (&lo)[R][C],
                               __m256 (&hi)[R][C]) {
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const __m256 w_lo = widen8(w[c]);
    const __m256 w_hi = widen8(w[c] + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r]), w_lo, lo[r][c]);
      hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + 8), w_hi, hi[r][c]);
    }
  }
}

// dots[r * C + c] = canonical dot of x row r with weight row c (TileArgs), each row prefetched
// prefetch_bytes ahead (see linear_avx512.cpp).
template <typename W, int R, int C>
FP8SERVE_AVX2 void tile(const TileArgs<W>& a, float* dots) {
  constexpr bool kScaled = std::is_same_v<W, std::uint8_t>;
  __m256 lo[R][C], hi[R][C];
  __m256 total_lo[R][C], total_hi[R][C];
  std::uintptr_t prefetch[C];
  prefetch_starts(a, prefetch);
  for (int64_t b = 0, begin = 0; begin < a.k; ++b, begin += a.block_k) {
    const int64_t end = begin + a.block_k < a.k ? begin + a.block_k : a.k;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
    }
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      if ((i * static_cast<int64_t>(sizeof(W))) % 64 == 0) {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          _mm_prefetch(reinterpret_cast<const char*>(prefetch[c] + static_cast<std::uintptr_t>(i * sizeof(W))),
                       _MM_HINT_T1);
        }
      }
      const float* xs[R];
      const W* ws[C];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) xs[r] = a.x + r * a.x_stride + i;
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) ws[c] = a.rows[c] + i;
      step<W, R, C>(xs, ws, lo, hi);
    }
    if (i < end) {
      // Tail through zero-padded copies: the missing lanes add 0 * 0, as in the scalar path.
      const std::size_t tail = static_cast<std::size_t>(end - i);
      float x_pad[R][16] = {};
      W w_pad[C][16] = {};
      const float* xs[R];
      const W* ws[C];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        std::memcpy(x_pad[r], a.x + r * a.x_stride + i, tail * sizeof(float));
        xs[r] = x_pad[r];
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        std::memcpy(w_pad[c], a.rows[c] + i, tail * sizeof(W));
        ws[c] = w_pad[c];
      }
      step<W, R, C>(xs, ws, lo, hi);
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      if constexpr (kScaled) {
        const __m256 scale = _mm256_set1_ps(a.scales[c][b] / kFp8SumUnit);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          total_lo[r][c] = _mm256_fmadd_ps(lo[r][c], scale, b == 0 ? _mm256_setzero_ps() : total_lo[r][c]);
          total_hi[r][c] = _mm256_fmadd_ps(hi[r][c], scale, b == 0 ? _mm256_setzero_ps() : total_hi[r][c]);
        }
      } else {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          total_lo[r][c] = lo[r][c];
          total_hi[r][c] = hi[r][c];
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) dots[r * C + c] = reduce16(total_lo[r][c], total_hi[r][c]);
  }
}

struct Tiles {
  template <typename W, int R, int C>
  static void run(const TileArgs<W>& a, float* dots) {
    tile<W, R, C>(a, dots);
  }
};

}  // namespace

void linear_block_avx2(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                       int64_t o_end) {
  TileWalk<Tiles, kRows, kCols> walk{job, kPrefetchTiles, kGemvPrefetchRows};
  walk.run(t_begin, t_end, o_begin, o_end);
}

}  // namespace fp8serve::cpu::detail
