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

#include "kernels/fp8.hpp"

namespace fp8serve {

inline float fp8_row_scale(float amax) { return std::max(amax / kFp8E4m3Max, FLT_MIN); }

// codes[0, n) and *scale from w[0, n). PRECOND: every w is finite.
inline void quantize_row_fp8(const float* w, int64_t n, uint8_t* codes, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float s = fp8_row_scale(amax);
  for (int64_t i = 0; i < n; ++i) codes[i] = fp8_e4m3_encode(w[i] / s);
  *scale = s;
}

}  // namespace fp8serve
