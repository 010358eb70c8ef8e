// The AVX-512 linear kernel: register tiles of kRows tokens x kCols weight rows, one zmm of 16
// partial sums per (token, weight row), bf16 widened to fp32 in registers (a zero-extend and a
// shift: bf16 is the top half of an fp32). The summation order is the one linear_scalar.cpp
// defines, so results are bitwise those of the scalar and AVX2 paths.

// GCC 12 reports its own intrinsics (the `__Y = __Y` idiom of _mm512_undefined_*) as
// uninitialized once they are inlined into a target("avx512f") function (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"

// AVX512BW+VL for the masked 16-bit tail loads: every CPU with AVX512BW also has VL.
#define FP8SERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

namespace fp8serve::cpu::detail {

namespace {

// 4 x 6 = 24 accumulators + 6 widened weight vectors + 1 activation vector fit the 32 zmm
// registers, with 4 + 6 loads per 24 FMAs.
constexpr int kRows = 4;
constexpr int kCols = 6;
// Software prefetch into L2 (T1), measured on batch-1 decode of a 56 MB matrix (Zen 4, 1 thread,
// a shared and noisy machine; GB/s against a streaming read of the same bytes). With the tile
// walking kCols adjacent rows: no prefetch 20-35%, 2 tiles ahead into L1 (T0) 40-70%, 1-8 tiles
// into L2 73-79%, NTA 56-65%. Walking kCols separate segments row after row (the batch-1 path
// below) and prefetching 4 rows ahead in each: 75-110% (the plain read suffers more from 4 KiB
// pages than the prefetching GEMV does).
constexpr int kPrefetchTiles = 4;         // GEMM tiles: tiles ahead
constexpr int64_t kGemvPrefetchRows = 4;  // batch-1 path: rows ahead in each segment

FP8SERVE_AVX512 inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// The canonical halving tree: (j + j+8), (j + j+4), (j + j+2), (j + j+1).
FP8SERVE_AVX512 inline float reduce16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// dots[r * C + c] = canonical dot of x row r with weight row rows[c].
// Each row is also prefetched (into L2) prefetch_bytes ahead of where it is being read: the
// hardware prefetcher follows a few long streams well but not C interleaved short ones.
// Prefetches past the end of the weights are harmless: they never fault.
template <int R, int C>
FP8SERVE_AVX512 void tile(const float* x, int64_t x_stride, const std::uint16_t* const* rows,
                          int64_t k, int64_t prefetch_bytes, float* dots) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  std::uintptr_t prefetch[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    prefetch[c] =
        reinterpret_cast<std::uintptr_t>(rows[c]) + static_cast<std::uintptr_t>(prefetch_bytes);
  }
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    if ((i & 31) == 0) {  // one prefetch per 64-byte line of each row
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        _mm_prefetch(
            reinterpret_cast<const char*>(prefetch[c] + static_cast<std::uintptr_t>(2 * i)),
            _MM_HINT_T1);
      }
    }
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[c] + i)));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * x_stride + i);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (i < k) {
    // Tail: masked loads, so the missing lanes add 0 * 0 exactly as the scalar path does.
    const int tail = static_cast<int>(k - i);
    const __mmask16 mask = static_cast<__mmask16>((1u << tail) - 1u);
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = widen_bf16(_mm256_maskz_loadu_epi16(mask, rows[c] + i));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + r * x_stride + i);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) dots[r * C + c] = reduce16(acc[r][c]);
  }
}

using TileFn = void (*)(const float*, int64_t, const std::uint16_t* const*, int64_t, int64_t,
                        float*);

struct TileTable {
  TileFn fn[kRows][kCols];
};

template <int R, int... Cs>
constexpr void fill_row(TileTable& table, std::integer_sequence<int, Cs...>) {
  ((table.fn[R - 1][Cs] = &tile<R, Cs + 1>), ...);
}

template <int... Rs>
constexpr TileTable make_tiles(std::integer_sequence<int, Rs...>) {
  TileTable table{};
  (fill_row<Rs + 1>(table, std::make_integer_sequence<int, kCols>{}), ...);
  return table;
}

// tiles.fn[rows - 1][cols - 1]: the tile for a partial block at the batch or output edge.
constexpr auto tiles = make_tiles(std::make_integer_sequence<int, kRows>{});

}  // namespace

void linear_block_avx512(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end) {
  float dots[kRows * kCols];
  const std::uint16_t* rows[kCols];
  auto store = [&](int64_t t, int num_rows, const int64_t* outs, int num_cols) {
    for (int r = 0; r < num_rows; ++r) {
      float* y = f32(p.y) + (t + r) * p.y_stride;
      for (int c = 0; c < num_cols; ++c) {
        const float dot = dots[r * num_cols + c];
        y[outs[c]] = p.bias ? dot + bf16_to_float(p.bias[outs[c]]) : dot;
      }
    }
  };
  int64_t outs[kCols];
  if (t_end - t_begin == 1) {
    // One token (batch-1 decode): the weights are read once and DRAM bound. The block is cut
    // into kCols contiguous segments read side by side, each walking its rows in memory order:
    // a few long sequential streams, which the prefetchers follow at full speed.
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
      store(t_begin, 1, outs, cols);
    }
    return;
  }
  for (int64_t o = o_begin; o < o_end; o += kCols) {
    const int cols = static_cast<int>(o_end - o < kCols ? o_end - o : kCols);
    for (int c = 0; c < cols; ++c) {
      outs[c] = o + c;
      rows[c] = p.weight + (o + c) * p.in_features;
    }
    // A tile's rows are contiguous: prefetch the rows kPrefetchTiles tiles further on.
    const int64_t prefetch_bytes = kPrefetchTiles * cols * p.in_features * 2;
    for (int64_t t = t_begin; t < t_end; t += kRows) {
      const int num_rows = static_cast<int>(t_end - t < kRows ? t_end - t : kRows);
      tiles.fn[num_rows - 1][cols - 1](f32(p.x) + t * p.x_stride, p.x_stride, rows, p.in_features,
                                       prefetch_bytes, dots);
      store(t, num_rows, outs, cols);
    }
  }
}

}  // namespace fp8serve::cpu::detail
