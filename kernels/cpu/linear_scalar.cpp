// The portable linear kernel, and the definition of the summation order every vectorized path
// reproduces bit for bit (kernels/cpu/linear.hpp): 16 lanes of fused multiply-adds over k, the
// in_features % 16 tail zero-padded, then the halving tree.
#include <cmath>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu::detail {

namespace {

float canonical_dot(const float* x, const std::uint16_t* w, int64_t k) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] = std::fma(x[i + j], bf16_to_float(w[i + j]), lanes[j]);
  }
  if (i < k) {
    // The vector paths run this step on zero-padded registers: a lane past the end adds
    // 0 * 0, which turns a -0 sum into +0, so it is done here too.
    for (int j = 0; j < 16; ++j) {
      const bool in = i + j < k;
      lanes[j] = std::fma(in ? x[i + j] : 0.0f, in ? bf16_to_float(w[i + j]) : 0.0f, lanes[j]);
    }
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] = lanes[j] + lanes[j + width];
  }
  return lanes[0];
}

}  // namespace

void linear_block_scalar(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const std::uint16_t* w = p.weight + o * p.in_features;
    const float bias = p.bias ? bf16_to_float(p.bias[o]) : 0.0f;
    for (int64_t t = t_begin; t < t_end; ++t) {
      const float dot = canonical_dot(f32(p.x) + t * p.x_stride, w, p.in_features);
      f32(p.y)[t * p.y_stride + o] = p.bias ? dot + bias : dot;
    }
  }
}

}  // namespace fp8serve::cpu::detail
