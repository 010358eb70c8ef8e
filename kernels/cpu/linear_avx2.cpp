// The AVX2 linear kernel: the same 16-lane partial sums as every path (kernels/cpu/linear.hpp),
// held as two ymm registers (lanes 0-7 and 8-15), so results are bitwise those of the scalar and
// AVX-512 paths. Register tiles of kRows tokens x kCols weight rows fit the 16 ymm registers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see linear_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"

#define FP8SERVE_AVX2 __attribute__((target("avx2,fma")))

namespace fp8serve::cpu::detail {

namespace {

// 2 x 3 tiles: 12 accumulators + 2 widened weight halves; activations come from memory.
constexpr int kRows = 2;
constexpr int kCols = 3;
constexpr int kPrefetchTiles = 4;  // see linear_avx512.cpp
constexpr int64_t kGemvPrefetchRows = 4;

FP8SERVE_AVX2 inline __m256 widen_bf16(const std::uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// The canonical halving tree, starting from lanes 0-7 (lo) and 8-15 (hi).
FP8SERVE_AVX2 inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

template <int R, int C>
FP8SERVE_AVX2 inline void step(const float* const (&x)[R], const std::uint16_t* const (&w)[C],
                               __m256 (&lo)[R][C], __m256 (&hi)[R][C]) {
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const __m256 w_lo = widen_bf16(w[c]);
    const __m256 w_hi = widen_bf16(w[c] + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r]), w_lo, lo[r][c]);
      hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x[r] + 8), w_hi, hi[r][c]);
    }
  }
}

// dots[r * C + c] = canonical dot of x row r with weight row rows[c]; each row prefetched
// prefetch_bytes ahead (see linear_avx512.cpp).
template <int R, int C>
FP8SERVE_AVX2 void tile(const float* x, int64_t x_stride, const std::uint16_t* const* rows,
                        int64_t k, int64_t prefetch_bytes, float* dots) {
  __m256 lo[R][C];
  __m256 hi[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  }
  std::uintptr_t prefetch[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    prefetch[c] =
        reinterpret_cast<std::uintptr_t>(rows[c]) + static_cast<std::uintptr_t>(prefetch_bytes);
  }
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if ((i & 31) == 0) {
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        _mm_prefetch(
            reinterpret_cast<const char*>(prefetch[c] + static_cast<std::uintptr_t>(2 * i)),
            _MM_HINT_T1);
      }
    }
    const float* xs[R];
    const std::uint16_t* ws[C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) xs[r] = x + r * x_stride + i;
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) ws[c] = rows[c] + i;
    step<R, C>(xs, ws, lo, hi);
  }
  if (i < k) {
    // Tail through zero-padded copies: the missing lanes add 0 * 0, as in the scalar path.
    const std::size_t tail = static_cast<std::size_t>(k - i);
    float x_pad[R][16] = {};
    std::uint16_t w_pad[C][16] = {};
    const float* xs[R];
    const std::uint16_t* ws[C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      std::memcpy(x_pad[r], x + r * x_stride + i, tail * sizeof(float));
      xs[r] = x_pad[r];
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      std::memcpy(w_pad[c], rows[c] + i, tail * sizeof(std::uint16_t));
      ws[c] = w_pad[c];
    }
    step<R, C>(xs, ws, lo, hi);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) dots[r * C + c] = reduce16(lo[r][c], hi[r][c]);
  }
}

using TileFn = void (*)(const float*, int64_t, const std::uint16_t* const*, int64_t, int64_t,
                        float*);

template <int R, int... Cs>
constexpr void fill_row(TileFn (&row)[kCols], std::integer_sequence<int, Cs...>) {
  ((row[Cs] = &tile<R, Cs + 1>), ...);
}

template <int... Rs>
constexpr auto make_tiles(std::integer_sequence<int, Rs...>) {
  struct Table {
    TileFn fn[kRows][kCols];
  } table{};
  (fill_row<Rs + 1>(table.fn[Rs], std::make_integer_sequence<int, kCols>{}), ...);
  return table;
}

constexpr auto tiles = make_tiles(std::make_integer_sequence<int, kRows>{});

}  // namespace

void linear_block_avx2(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                       int64_t o_end) {
  // The same walk as linear_block_avx512: segments for one token, adjacent-row tiles otherwise.
  float dots[kRows * kCols];
  const std::uint16_t* rows[kCols];
  int64_t outs[kCols];
  auto store = [&](int64_t t, int num_rows, int num_cols) {
    for (int r = 0; r < num_rows; ++r) {
      float* y = f32(p.y) + (t + r) * p.y_stride;
      for (int c = 0; c < num_cols; ++c) {
        const float dot = dots[r * num_cols + c];
        y[outs[c]] = p.bias ? dot + bf16_to_float(p.bias[outs[c]]) : dot;
      }
    }
  };
  if (t_end - t_begin == 1) {
    const int64_t n = o_end - o_begin;
    const int64_t per_segment = (n + kCols - 1) / kCols;
    for (int64_t r = 0; r < per_segment; ++r) {
      int cols = 0;
      for (int s = 0; s < kCols; ++s) {
        const int64_t o = o_begin + s * per_segment + r;
        if (o < o_end) {
          outs[cols] = o;
          rows[cols++] = p.weight + o * p.in_features;
        }
      }
      tiles.fn[0][cols - 1](f32(p.x) + t_begin * p.x_stride, p.x_stride, rows, p.in_features,
                            kGemvPrefetchRows * p.in_features * 2, dots);
      store(t_begin, 1, cols);
    }
    return;
  }
  for (int64_t o = o_begin; o < o_end; o += kCols) {
    const int cols = static_cast<int>(o_end - o < kCols ? o_end - o : kCols);
    for (int c = 0; c < cols; ++c) {
      outs[c] = o + c;
      rows[c] = p.weight + (o + c) * p.in_features;
    }
    const int64_t prefetch_bytes = kPrefetchTiles * cols * p.in_features * 2;
    for (int64_t t = t_begin; t < t_end; t += kRows) {
      const int num_rows = static_cast<int>(t_end - t < kRows ? t_end - t : kRows);
      tiles.fn[num_rows - 1][cols - 1](f32(p.x) + t * p.x_stride, p.x_stride, rows, p.in_features,
                                       prefetch_bytes, dots);
      store(t, num_rows, cols);
    }
  }
}

}  // namespace fp8serve::cpu::detail
