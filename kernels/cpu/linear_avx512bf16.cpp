// The bf16-dot linear kernel (kernels/cpu/linear.hpp): x rounded to bf16 once per call, weights
// entering vdpbf16ps exactly (bf16 as stored, FP8 through the byte table of fp8_bf16_table.hpp),
// products summed in fp32. Register tiles of R tokens x C weight rows, one zmm of 16 fp32 lanes
// per (token, weight row).
//
// The order of one dot product, fixed for every tile: rows are read in chunks of 64 inputs; a
// chunk is two halves W0 and W1 of 32 bf16 each, and acc = vdpbf16ps(acc, X0, W0) then
// vdpbf16ps(acc, X1, W1), where X0 / X1 are the matching halves of the bf16 copy of x:
//   bf16 weights  W0 = inputs 0..31 of the chunk, W1 = inputs 32..63 (as stored)
//   FP8 weights   W0 = inputs 16 L + (0..7), W1 = inputs 16 L + 8 + (0..7), L = 0..3 (what the
//                 table lookup's byte interleave gives), so x is copied in that order
// The last chunk is zero-padded (masked weight loads, x copy padded with zeros). Blocks, scales,
// the halving tree and the bias as in every path.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593, see linear_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/fp8_bf16_table.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/linear_avx512_common.hpp"
#include "kernels/cpu/linear_tiles.hpp"
#include "kernels/cpu/ops.hpp"

#define FP8SERVE_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c")))

namespace fp8serve::cpu::detail {

namespace {

// 4 x 4 = 16 accumulators + 8 weight halves + the 5 table registers of FP8 fit the 32 zmm
// registers (x comes from memory as vdpbf16ps's operand).
constexpr int kRows = 4;
constexpr int kCols = 4;
constexpr int kGemvCols = 8;  // batch 1: rows read side by side
constexpr int kPrefetchTiles = 4;
constexpr int64_t kGemvPrefetchRows = 4;

FP8SERVE_AVX512BF16 inline __m512 dot(__m512 acc, __m512i x, __m512i w) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(x), reinterpret_cast<__m512bh>(w));
}


// The halves W0, W1 of one 64-input chunk of a weight row; `remaining` < 64 on the last chunk.
struct ChunkLoader {
  Fp8Bf16Lut lut;
  FP8SERVE_AVX512BF16 void load(const std::uint16_t* w, int64_t remaining, __m512i& w0, __m512i& w1) const {
    if (remaining >= 64) {
      w0 = _mm512_loadu_si512(w);
      w1 = _mm512_loadu_si512(w + 32);
      return;
    }
    const __mmask32 m0 = remaining >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1ull << remaining) - 1);
    const __mmask32 m1 = remaining > 32 ? static_cast<__mmask32>((1ull << (remaining - 32)) - 1) : 0;
    w0 = _mm512_maskz_loadu_epi16(m0, w);
    w1 = _mm512_maskz_loadu_epi16(m1, w + 32);
  }
  FP8SERVE_AVX512BF16 void load(const std::uint8_t* w, int64_t remaining, __m512i& w0, __m512i& w1) const {
    const __m512i bytes = remaining >= 64
                              ? _mm512_loadu_si512(w)
                              : _mm512_maskz_loadu_epi8(static_cast<__mmask64>((1ull << remaining) - 1), w);
    fp8_to_bf16(bytes, lut, w0, w1);
  }
};

// dots[r * C + c] = the bf16 dot of x_bf16 row r with weight row c (TileArgs), each row
// prefetched prefetch_bytes ahead (see linear_avx512.cpp).
template <typename W, int R, int C>
FP8SERVE_AVX512BF16 void tile(const TileArgs<W>& a, float* dots) {
  constexpr bool kScaled = std::is_same_v<W, std::uint8_t>;
  ChunkLoader loader;
  if constexpr (kScaled) loader.lut = fp8_bf16_lut();
  __m512 total[R][C];
  __m512 acc[R][C];
  std::uintptr_t prefetch[C];
  prefetch_starts(a, prefetch);
  for (int64_t b = 0, begin = 0; begin < a.k; ++b, begin += a.block_k) {
    const int64_t end = begin + a.block_k < a.k ? begin + a.block_k : a.k;
    zero_tile(acc);
    for (int64_t i = begin; i < end; i += 64) {
      // 64 inputs are 64 (FP8) or 128 (bf16) bytes of each row: one or two lines to prefetch.
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const std::uintptr_t at = prefetch[c] + static_cast<std::uintptr_t>(i * sizeof(W));
        _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T1);
        if constexpr (sizeof(W) == 2) _mm_prefetch(reinterpret_cast<const char*>(at + 64), _MM_HINT_T1);
      }
      __m512i w0[C], w1[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) loader.load(a.rows[c] + i, end - i, w0[c], w1[c]);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const std::uint16_t* x = a.x_bf16 + r * a.x_stride + i;
        const __m512i x0 = _mm512_loadu_si512(x);
        const __m512i x1 = _mm512_loadu_si512(x + 32);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = dot(dot(acc[r][c], x0, w0[c]), x1, w1[c]);
      }
    }
    end_block<kScaled, R, C>(a.scales, b, 1.0f, acc, total);
  }
  reduce_tile<R, C>(total, dots);
}

struct Tiles {
  template <typename W, int R, int C>
  static void run(const TileArgs<W>& a, float* dots) {
    tile<W, R, C>(a, dots);
  }
};

// 16 fp32 (lanes past `n` read as 0) -> 16 bf16, round to nearest even.
FP8SERVE_AVX512BF16 inline __m256i round16(const float* x, int64_t n) {
  const __m512 v = n >= 16 ? _mm512_loadu_ps(x)
                           : _mm512_maskz_loadu_ps(n > 0 ? static_cast<__mmask16>((1u << n) - 1) : 0, x);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
}

}  // namespace

FP8SERVE_AVX512BF16 void linear_round_x_avx512bf16(const LinearJob& job, std::uint16_t* x_bf16,
                                                   int64_t t_begin, int64_t t_end) {
  const LinearParams& p = job.p;
  const bool fp8 = p.weight_dtype == WeightDtype::fp8_e4m3;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* x = f32(p.x) + t * p.x_stride;
    std::uint16_t* out = x_bf16 + t * job.x_bf16_stride;
    for (int64_t i = 0; i < job.x_bf16_stride; i += 64) {
      const int64_t n = p.in_features - i;  // inputs left; the copy is zero past the row
      const __m256i c0 = round16(x + i, n), c1 = round16(x + i + 16, n - 16);
      const __m256i c2 = round16(x + i + 32, n - 32), c3 = round16(x + i + 48, n - 48);
      __m512i x0 = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);  // inputs 0..31
      __m512i x1 = _mm512_inserti64x4(_mm512_castsi256_si512(c2), c3, 1);  // inputs 32..63
      if (fp8) {
        // The FP8 halves: the low 8 inputs of each 16, then the high 8 (fp8_to_bf16's order).
        const __m512i lo = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i hi = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
        x0 = lo;
        x1 = hi;
      }
      _mm512_storeu_si512(out + i, x0);
      _mm512_storeu_si512(out + i + 32, x1);
    }
  }
}

void linear_block_avx512bf16(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                             int64_t o_end) {
  TileWalk<Tiles, kRows, kCols, kGemvCols> walk{job, kPrefetchTiles, kGemvPrefetchRows};
  walk.run(t_begin, t_end, o_begin, o_end);
}

}  // namespace fp8serve::cpu::detail
