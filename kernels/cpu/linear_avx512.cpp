// The AVX-512 fp32-dot linear kernel: register tiles of R tokens x C weight rows, one zmm of 16
// partial sums per (token, weight row), weights widened to fp32 in registers (bf16: a
// zero-extend and a shift, bf16 being the top half of an fp32; FP8: the fp16 trick, see
// widen_fp8). The summation order is the one linear_scalar.cpp defines, so results are bitwise
// those of the scalar and AVX2 paths.

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
#include "kernels/cpu/linear_avx512_common.hpp"
#include "kernels/cpu/linear_tiles.hpp"
#include "kernels/cpu/ops.hpp"

// AVX512BW+VL for the masked 8- and 16-bit tail loads: every CPU with AVX512BW also has VL.
#define FP8SERVE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace fp8serve::cpu::detail {

namespace {

// 4 x 6 = 24 accumulators + 6 widened weight vectors + 1 activation vector fit the 32 zmm
// registers, with 4 + 6 loads per 24 FMAs.
constexpr int kRows = 4;
constexpr int kCols = 6;
// Software prefetch into L2 (T1): the distances that measured best (docs/cpu.md, "Prefetch").
constexpr int kPrefetchTiles = 4;         // GEMM tiles: tiles ahead
constexpr int64_t kGemvPrefetchRows = 4;  // batch-1 path: rows ahead in each segment

// 16 weights -> 16 fp32, exactly. bf16: the bits move to the top half.
FP8SERVE_AVX512 inline __m512 widen(const std::uint16_t* w) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
FP8SERVE_AVX512 inline __m512 widen_masked(const std::uint16_t* w, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, w);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// FP8: each E4M3 byte, sign-extended to 16 bits, shifted left by 7 and masked, is the fp16 of
// its value times 2^-8 (the 4 exponent bits land in fp16's 5-bit field, whose bias is 8 more),
// subnormals included; vcvtph2ps widens that exactly.
FP8SERVE_AVX512 inline __m512 fp8_bytes_to_f32(__m128i bytes) {
  __m256i halves = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
  halves = _mm256_and_si256(halves, _mm256_set1_epi16(static_cast<short>(0xbf80)));
  return _mm512_cvtph_ps(halves);
}
FP8SERVE_AVX512 inline __m512 widen(const std::uint8_t* w) {
  return fp8_bytes_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
FP8SERVE_AVX512 inline __m512 widen_masked(const std::uint8_t* w, __mmask16 mask) {
  return fp8_bytes_to_f32(_mm_maskz_loadu_epi8(mask, w));
}


// dots[r * C + c] = canonical dot of x row r with weight row rows[c] (TileArgs). Each row is also
// prefetched (into L2) prefetch_bytes ahead of where it is being read: the hardware prefetcher
// follows a few long streams well but not C interleaved short ones. Prefetches past the end of
// the weights are harmless: they never fault.
template <typename W, int R, int C>
FP8SERVE_AVX512 void tile(const TileArgs<W>& a, float* dots) {
  constexpr bool kScaled = std::is_same_v<W, std::uint8_t>;
  __m512 total[R][C];
  __m512 acc[R][C];
  std::uintptr_t prefetch[C];
  prefetch_starts(a, prefetch);
  for (int64_t b = 0, begin = 0; begin < a.k; ++b, begin += a.block_k) {
    const int64_t end = begin + a.block_k < a.k ? begin + a.block_k : a.k;
    zero_tile(acc);
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      if ((i * static_cast<int64_t>(sizeof(W))) % 64 == 0) {  // one prefetch per 64-byte line of each row
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          _mm_prefetch(reinterpret_cast<const char*>(prefetch[c] + static_cast<std::uintptr_t>(i * sizeof(W))),
                       _MM_HINT_T1);
        }
      }
      __m512 wv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) wv[c] = widen(a.rows[c] + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_loadu_ps(a.x + r * a.x_stride + i);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    if (i < end) {
      // Tail: masked loads, so the missing lanes add 0 * 0 exactly as the scalar path does.
      const __mmask16 mask = static_cast<__mmask16>((1u << (end - i)) - 1u);
      __m512 wv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) wv[c] = widen_masked(a.rows[c] + i, mask);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 xv = _mm512_maskz_loadu_ps(mask, a.x + r * a.x_stride + i);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
    end_block<kScaled, R, C>(a.scales, b, 1.0f / kFp8SumUnit, acc, total);
  }
  reduce_tile<R, C>(total, dots);
}

struct Tiles {
  template <typename W, int R, int C>
  static void run(const TileArgs<W>& a, float* dots) {
    tile<W, R, C>(a, dots);
  }
};

}  // namespace

void linear_block_avx512(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end) {
  TileWalk<Tiles, kRows, kCols> walk{job, kPrefetchTiles, kGemvPrefetchRows};
  walk.run(t_begin, t_end, o_begin, o_end);
}

}  // namespace fp8serve::cpu::detail
