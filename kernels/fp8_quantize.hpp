#pragma once
// Weights to FP8 E4M3 with one fp32 scale per row (per output channel), host side: what
// --quantization fp8 does to every projection at load (kernels/forward_ops.hpp, LinearParams).
//   scale = max(amax(row) / 448, FLT_MIN), code = fp8_e4m3_encode(w / scale)
// as vLLM's per-channel FP8 does, through the project's one codec (satfinite, round to nearest
// even): the largest |w| of a row maps to 448, nothing saturates.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/fp8_encode_avx512.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve {

// codes[i] = fp8_e4m3_encode(w[i] / scale), 16 at a time where the CPU has AVX-512F (bitwise the
// same: fp8_encode_avx512.hpp), so quantizing a model at load takes a fraction of a second.
FP8SERVE_TARGET_AVX512F inline void encode_row_fp8_avx512(const float* w, int64_t n, float scale, uint8_t* codes) {
  const __m512 divisor = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i),
                     cpu::fp8_e4m3_encode16(_mm512_div_ps(_mm512_loadu_ps(w + i), divisor)));
  }
  if (i < n) {  // the last n % 16 through a zero-padded copy
    alignas(64) float tail[16] = {};
    alignas(16) uint8_t tail_codes[16];
    std::memcpy(tail, w + i, static_cast<std::size_t>(n - i) * sizeof(float));
    _mm_store_si128(reinterpret_cast<__m128i*>(tail_codes), cpu::fp8_e4m3_encode16(_mm512_div_ps(_mm512_load_ps(tail), divisor)));
    std::memcpy(codes + i, tail_codes, static_cast<std::size_t>(n - i));
  }
}

inline float fp8_row_scale(float amax) { return std::max(amax / kFp8E4m3Max, FLT_MIN); }

// codes[0, n) and *scale from w[0, n). PRECOND: every w is finite.
inline void quantize_row_fp8(const float* w, int64_t n, uint8_t* codes, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float s = fp8_row_scale(amax);
  if (cpu::cpu_features().avx512f) {
    encode_row_fp8_avx512(w, n, s, codes);
  } else {
    for (int64_t i = 0; i < n; ++i) codes[i] = fp8_e4m3_encode(w[i] / s);
  }
  *scale = s;
}

}  // namespace fp8serve
