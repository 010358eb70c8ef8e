// Paged attention work item, AVX512-BF16 build: the fp32 structure of attention_tile_avx512.cpp
// (online softmax, 16 lanes) with both matrix products on vdpbf16ps, which does 32
// multiply-adds per instruction where an fp32 FMA does 16. That is the kernel's limit: with the
// pool in cache the fp32 build spends ~85% of its time in the two products' FMAs, not in
// converting FP8 (measured by removing each part in turn).
//
// Precision: K and V enter the products exactly (every E4M3 value and every bf16 value is a
// bf16 number); q (times its scales) and the softmax probabilities are rounded to bf16 (a
// relative error below 2^-8 per element, against E4M3's 2^-4 for K and V); products are exact
// in fp32 and summed in fp32. vdpbf16ps treats bf16 denormals as zero: only q elements below
// 1e-38 and probabilities below 2^-126 of the row's running maximum, which change nothing.
//
// FP8 -> bf16: a 128-entry table lookup on the 7 magnitude bits (vpermt2b, two tables for the
// high and the low byte of the bf16 bits) plus the sign bit; the bytes are then interleaved
// into words within each 128-bit lane, which permutes elements within 64-element units. The
// dot products do not care as long as q is permuted the same way (prepare_q); the value
// accumulators hold their columns permuted (o_slot says where). Called only when cpu_features()
// reports avx512f, avx512bw, avx512vbmi, avx512bf16, avx2, fma and f16c, for head_dim % 64 == 0.
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
#include "kernels/fp8.hpp"

namespace fp8serve::cpu {
namespace {

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
const Fp8Bf16Table kFp8Bf16Table;

}  // namespace
}  // namespace fp8serve::cpu

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

  struct Lut {
    __m512i hi0, hi1, lo0, lo1, sign;
  };
  static Lut lut() {
    const uint8_t* t = kFp8Bf16Table.bytes;
    return {_mm512_load_si512(t), _mm512_load_si512(t + 64), _mm512_load_si512(t + 128),
            _mm512_load_si512(t + 192), _mm512_set1_epi8(static_cast<char>(0x80))};
  }
  // 64 FP8 bytes -> 32 bf16 in w0 (bytes 0..7 of each 128-bit lane) and 32 in w1 (bytes 8..15).
  static void fp8_to_bf16(__m512i bytes, const Lut& t, __m512i& w0, __m512i& w1) {
    // hi | (bytes & 0x80): the table's high byte with the FP8 sign put back.
    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t.hi0, bytes, t.hi1), bytes,
                                                 t.sign, 0xf8);
    const __m512i lo = _mm512_permutex2var_epi8(t.lo0, bytes, t.lo1);
    w0 = _mm512_unpacklo_epi8(lo, hi);
    w1 = _mm512_unpackhi_epi8(lo, hi);
  }
  static __m512 dot(__m512 acc, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }

  // q as bf16, in the element order the K row takes after conversion: for FP8, word k of
  // vector h of a unit is element 16 * (k / 8) + 8 * h + k % 8 (fp8_to_bf16's order).
  template <class T>
  static void prepare_q(const float* q, int head_dim, uint16_t* out) {
    for (int c = 0; c < head_dim; c += kUnit) {
      for (int i = 0; i < kUnit; ++i) {
        const int element = std::is_same_v<T, uint8_t> ? 16 * ((i % 32) / 8) + 8 * (i / 32) + i % 8 : i;
        out[c + i] = bf16_encode(q[c + element]);
      }
    }
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

  // As tile::score_keys: s[r][j] = q[r] . k[j] for j < nj_padded (keys past nj repeat key nj - 1),
  // prefetching the next block as it goes.
  // Four keys at a time (16 accumulators; q is loaded once per four keys, which keeps the loads
  // below the dot products), each group of four folded at once into one vector of per-128-bit-
  // lane sums: the same additions as reduce_add_transposed, without spilling 16 vectors a row.
  template <class T, int NR, class NextBlock>
  static void score_keys(const uint16_t (*q)[kMaxHeadDim], const T* k, int64_t token_stride, int head_dim,
                         int nj, int nj_padded, float (*s)[kKeyChunk], NextBlock& next) {
    constexpr int KU = 4;
    [[maybe_unused]] const Lut t = lut();
    for (int j0 = 0; j0 < nj_padded; j0 += W) {
      Reg groups[NR][W / KU];
      for (int g = 0; g < W / KU; ++g) {
        next.advance(std::min(j0 + (g + 1) * KU, nj), nj);
        const T* rows[KU];
#pragma GCC unroll 4
        for (int u = 0; u < KU; ++u) rows[u] = k + std::min(j0 + g * KU + u, nj - 1) * token_stride;
        Reg acc[KU][NR];
#pragma GCC unroll 4
        for (int u = 0; u < KU; ++u)
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) acc[u][r] = zero();
        for (int c = 0; c < head_dim; c += kUnit) {
          __m512i kv[KU][2];
#pragma GCC unroll 4
          for (int u = 0; u < KU; ++u) {
            if constexpr (std::is_same_v<T, uint8_t>) {
              fp8_to_bf16(_mm512_loadu_si512(rows[u] + c), t, kv[u][0], kv[u][1]);
            } else {
              kv[u][0] = _mm512_loadu_si512(rows[u] + c);
              kv[u][1] = _mm512_loadu_si512(rows[u] + c + 32);
            }
          }
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              const __m512i qv = _mm512_load_si512(q[r] + c + 32 * h);
#pragma GCC unroll 4
              for (int u = 0; u < KU; ++u) acc[u][r] = dot(acc[u][r], qv, kv[u][h]);
            }
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) groups[r][g] = hadd(hadd(acc[0][r], acc[1][r]), hadd(acc[2][r], acc[3][r]));
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        store(s[r] + j0, add_lanes(add_lanes(groups[r][0], groups[r][1]), add_lanes(groups[r][2], groups[r][3])));
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
                                int64_t token_stride, int head_dim, int nj, float (*o)[kMaxHeadDim]) {
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
        const T* a = v + 2 * jp * token_stride + c;
        const T* b = v + std::min(2 * jp + 1, nj - 1) * token_stride + c;
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
