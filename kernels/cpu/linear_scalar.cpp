// The portable linear kernel, and the definition of the fp32-dot summation order every fp32
// vectorized path reproduces bit for bit (kernels/cpu/linear.hpp): per block of block_k inputs,
// 16 lanes of fused multiply-adds over k with the block's % 16 tail zero-padded; FP8 blocks
// folded into the lanes' totals with their scale; then the halving tree and the bias.
#include <cmath>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::cpu::detail {

namespace {

// The value a weight enters the fp32 sums with: bf16 exactly, FP8 as decode(q) * 2^-8.
float weight_value(const LinearParams& p, int64_t o, int64_t k) {
  if (p.weight_dtype == WeightDtype::bf16) {
    return bf16_to_float(static_cast<const std::uint16_t*>(p.weight)[o * p.in_features + k]);
  }
  return fp8_e4m3_decode(static_cast<const std::uint8_t*>(p.weight)[o * p.in_features + k]) *
         kFp8SumUnit;
}

float canonical_dot(const LinearJob& job, const float* x, int64_t o) {
  const LinearParams& p = job.p;
  const bool scaled = p.weight_dtype == WeightDtype::fp8_e4m3;
  float total[16] = {};
  for (int64_t b = 0; b < job.num_k_blocks; ++b) {
    const int64_t begin = b * p.weight_block_k;
    const int64_t end = std::min(begin + p.weight_block_k, p.in_features);
    float lanes[16] = {};
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) {
      for (int j = 0; j < 16; ++j) lanes[j] = std::fma(x[i + j], weight_value(p, o, i + j), lanes[j]);
    }
    if (i < end) {
      // The vector paths run this step on zero-padded registers: a lane past the end adds
      // 0 * 0, which turns a -0 sum into +0, so it is done here too.
      for (int j = 0; j < 16; ++j) {
        const bool in = i + j < end;
        lanes[j] = std::fma(in ? x[i + j] : 0.0f, in ? weight_value(p, o, i + j) : 0.0f, lanes[j]);
      }
    }
    if (scaled) {
      const float scale = p.weight_scales[o * job.num_k_blocks + b] / kFp8SumUnit;
      for (int j = 0; j < 16; ++j) total[j] = std::fma(lanes[j], scale, total[j]);
    } else {
      for (int j = 0; j < 16; ++j) total[j] = lanes[j];
    }
  }
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) total[j] = total[j] + total[j + width];
  }
  return total[0];
}

}  // namespace

void linear_block_scalar(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end) {
  const LinearParams& p = job.p;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const float bias = p.bias ? bf16_to_float(p.bias[o]) : 0.0f;
    for (int64_t t = t_begin; t < t_end; ++t) {
      const float dot = canonical_dot(job, f32(p.x) + t * p.x_stride, o);
      f32(p.y)[t * p.y_stride + o] = p.bias ? dot + bias : dot;
    }
  }
}

}  // namespace fp8serve::cpu::detail
