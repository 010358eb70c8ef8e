// Paged attention work item, AVX512-BF16 build: the fp32 structure of attention_tile_avx512.cpp
// (online softmax, 16 lanes) with both matrix products on vdpbf16ps, which does 32
// multiply-adds per instruction where an fp32 FMA does 16. That is the kernel's limit: the two
// products' FMAs, not converting FP8 (docs/cpu.md, "Where attention's time goes").
//
// Precision: K and V enter the products exactly (every E4M3 value and every bf16 value is a
// bf16 number); q (times its scales) and the softmax probabilities are rounded to bf16 (a
// relative error below 2^-8 per element, against E4M3's 2^-4 for K and V); products are exact
// in fp32 and summed in fp32. vdpbf16ps treats bf16 denormals as zero: only q elements below
// 1e-38 and probabilities below 2^-126 of the row's running maximum, which change nothing.
//
// FP8 -> bf16: a 128-entry table lookup on the 7 magnitude bits (vpermt2b, two tables for the
// high and the low byte of the bf16 bits) plus the sign bit; the bytes are then interleaved
// into words within each 128-bit lane. For K, whose 4-byte groups hold 4 elements of one key,
// that pairs each key's elements as the scores need (score_keys); for V it permutes columns
// within 64-element units, so the value accumulators hold their columns permuted (o_slot says
// where). Called only when cpu_features() reports avx512f, avx512bw, avx512vbmi, avx512bf16,
// avx2, fma and f16c, for head_dim % 64 == 0.
#if defined(__GNUC__) && !defined(__clang__)
// GCC bug 105593, as in attention_tile_avx512.cpp.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/bf16.hpp"
#include "kernels/cpu/attention_item.hpp"
#include "kernels/cpu/fp8_bf16_table.hpp"
#include "kernels/fp8.hpp"


#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16,avx2,fma,f16c")
#endif

namespace fp8serve::cpu {
namespace {

#include "kernels/cpu/attention_vec_avx512.hpp"

constexpr int kUnit = 64;  // elements per FP8 conversion unit (one 64-byte load)

struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kDotBf16 = true;
  static constexpr int kMaxRows = 4;         // 4 rows x 4 value vectors = 16 accumulators
  static constexpr float kFp8Unit = 1.0f;    // the table gives exact values

  using Lut = Fp8Bf16Lut;
  static Lut lut() { return fp8_bf16_lut(); }
  // 64 FP8 bytes -> 32 bf16 in w0 (bytes 0..7 of each 128-bit lane) and 32 in w1 (bytes 8..15).
  static void fp8_to_bf16(__m512i bytes, const Lut& t, __m512i& w0, __m512i& w1) {
    cpu::fp8_to_bf16(bytes, t, w0, w1);
  }
  static __m512 dot(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }

  // q as bf16, in its own order: the K layout puts each key's elements in the order the score
  // products take them (score_keys).
  static void prepare_q(const float* q, int head_dim, uint16_t* out) {
    for (int d = 0; d < head_dim; ++d) out[d] = bf16_encode(q[d]);
  }

  // Value columns: the accumulator u of a 64-column unit holds, in lane 4 L + i, column
  // 16 L + 4 u + i (FP8: bytes of the two rows interleaved, then converted) or
  // 32 (u / 2) + 8 L + 4 (u % 2) + i (bf16: words of the two rows interleaved).
  template <class T>
  static int o_slot(int d) {
    const int base = d - d % kUnit, w = d % kUnit;
    int u, lane;
    if constexpr (std::is_same_v<T, uint8_t>) {
      u = (w % 16) / 4, lane = w / 16;
    } else {
      u = 2 * (w / 32) + (w % 8) / 4, lane = (w % 32) / 8;
    }
    return base + 16 * u + 4 * lane + w % 4;
  }

  // As tile::score_keys, 16 keys in lanes per pass, prefetching the next block as it goes.
  // FP8: one 64-byte line holds element group g (4 elements) of 16 keys; converted, w0 holds
  // keys 4L and 4L + 1 of each 128-bit lane L as (elements 0-1, elements 2-3) pairs and w1 keys
  // 4L + 2 and 4L + 3, so q's 4 elements broadcast as one 64-bit pattern multiply both, and one
  // pairwise add per row at the end (hadd) leaves the 16 scores in key order. bf16: a line holds
  // element pair g of 16 keys, one key per 32-bit lane: q's pair broadcast, no reduction at all;
  // two accumulators per row (even and odd g) keep 8 dot-product chains in flight.
  template <class T, int NR, class NextBlock>
  static void score_keys(const uint16_t (*q)[kMaxHeadDim], const T* k, int64_t group_stride, int lanes_left,
                         int head_dim, int nj_padded, float (*s)[kKeyChunk], NextBlock& next) {
    constexpr int P = kKPack<T>;
    [[maybe_unused]] const Lut t = lut();
    const int groups = head_dim / P;
    const int passes = nj_padded / W;
    for (int pass = 0; pass < passes; ++pass) {
      const int j0 = pass * W;
      const int lanes = std::min(W, lanes_left - j0);
      Reg a0[NR], a1[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) a0[r] = a1[r] = zero();
      for (int g = 0; g < groups; g += 2) {
        next.advance(pass * groups + g + 2, passes * groups);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m512i line = load_groups(k + (g + h) * group_stride + j0 * P, lanes);
          if constexpr (std::is_same_v<T, uint8_t>) {
            __m512i w0, w1;
            fp8_to_bf16(line, t, w0, w1);
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r) {
              int64_t quad;
              std::memcpy(&quad, q[r] + (g + h) * 4, sizeof quad);
              const __m512i qq = _mm512_set1_epi64(quad);
              a0[r] = dot(a0[r], qq, w0);
              a1[r] = dot(a1[r], qq, w1);
            }
          } else {
#pragma GCC unroll 4
            for (int r = 0; r < NR; ++r) {
              int32_t pair;
              std::memcpy(&pair, q[r] + (g + h) * 2, sizeof pair);
              Reg& acc = h == 0 ? a0[r] : a1[r];
              acc = dot(acc, _mm512_set1_epi32(pair), line);
            }
          }
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        store(s[r] + j0, std::is_same_v<T, uint8_t> ? hadd(a0[r], a1[r]) : add(a0[r], a1[r]));
      }
    }
  }

  // Two value rows' 64-column unit as 4 vectors of 16 (row a, row b) bf16 pairs.
  template <class T>
  static void value_pairs(const T* a, const T* b, [[maybe_unused]] const Lut& t, __m512i (&out)[4]) {
    if constexpr (std::is_same_v<T, uint8_t>) {
      const __m512i ra = _mm512_loadu_si512(a), rb = _mm512_loadu_si512(b);
      fp8_to_bf16(_mm512_unpacklo_epi8(ra, rb), t, out[0], out[1]);
      fp8_to_bf16(_mm512_unpackhi_epi8(ra, rb), t, out[2], out[3]);
    } else {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i ra = _mm512_loadu_si512(a + 32 * h), rb = _mm512_loadu_si512(b + 32 * h);
        out[2 * h] = _mm512_unpacklo_epi16(ra, rb);
        out[2 * h + 1] = _mm512_unpackhi_epi16(ra, rb);
      }
    }
  }

  // As tile::accumulate_values, two keys per vdpbf16ps: o[r] = o[r] * alpha[r] + sum_j p[r][j] v[j].
  // p[r][j] is 0 for nj <= j < the next multiple of W (the softmax masks them), so an odd last
  // key pairs with itself at weight 0.
  template <class T, int NR>
  static void accumulate_values(const float (*p)[kKeyChunk], const float* alpha, const T* v,
                                int64_t v_token_stride, int head_dim, int nj, float (*o)[kMaxHeadDim]) {
    alignas(64) uint16_t pb[NR][kKeyChunk];
    for (int r = 0; r < NR; ++r) {
      for (int j = 0; j < nj; j += W) {
        const __m256bh b = _mm512_cvtneps_pbh(load(p[r] + j));
        std::memcpy(pb[r] + j, &b, sizeof b);
      }
    }
    [[maybe_unused]] const Lut t = lut();
    const int pairs = (nj + 1) / 2;
    for (int c = 0; c < head_dim; c += kUnit) {
      Reg acc[4][NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const Reg a = set1(alpha[r]);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[u][r] = mul(load(o[r] + c + u * W), a);
      }
      for (int jp = 0; jp < pairs; ++jp) {
        const T* a = v + 2 * jp * v_token_stride + c;
        const T* b = v + std::min(2 * jp + 1, nj - 1) * v_token_stride + c;
        __m512i vv[4];
        value_pairs<T>(a, b, t, vv);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          uint32_t pair;
          std::memcpy(&pair, pb[r] + 2 * jp, sizeof pair);
          const __m512i pr = _mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) acc[u][r] = dot(acc[u][r], pr, vv[u]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) store(o[r] + c + u * W, acc[u][r]);
    }
  }
};

}  // namespace
}  // namespace fp8serve::cpu

#include "kernels/cpu/attention_tile_impl.hpp"

namespace fp8serve::cpu {

void attend_item_avx512bf16(const AttentionItem& item) { tile::attend_item_dispatch<VecAvx512Bf16>(item); }

}  // namespace fp8serve::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
