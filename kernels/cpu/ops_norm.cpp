// RMSNorm over whole hidden rows and per head (Qwen3's q/k norm), optionally fused with the
// residual add: see kernels/cpu/ops.hpp.
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

namespace {

// Sum of squares with 16 fp32 partial sums (lane j takes elements j, j + 16, ...) reduced by a
// fixed halving tree: the compiler vectorizes the lanes, and the order never depends on the
// batch or the thread that runs the row.
float sum_of_squares(const float* x, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) lanes[j] += x[i + j] * x[i + j];
  }
  for (int j = 0; i + j < n; ++j) lanes[j] += x[i + j] * x[i + j];
  for (int width = 8; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

void rms_norm_row(const float* x, const std::uint16_t* weight, float* out, int64_t dim, float eps) {
  const float mean = sum_of_squares(x, dim) / static_cast<float>(dim);
  const float inv_rms = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < dim; ++i) {
    const float normed = x[i] * inv_rms;  // rounded before the weight multiplies, as in HF
    out[i] = bf16_to_float(weight[i]) * normed;
  }
}

}  // namespace

void rms_norm_cpu(const RmsNormParams& p, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.num_heads < 1 || p.dim < 1 || !(p.eps >= 0.0f)) {
    throw std::invalid_argument("rms_norm_cpu: bad shape or eps");
  }
  if (p.num_tokens == 0) return;
  const int64_t row_elems = p.num_heads * p.dim;
  const int64_t x_stride = p.x_token_stride ? p.x_token_stride : row_elems;
  const int64_t out_stride = p.out_token_stride ? p.out_token_stride : row_elems;
  const int64_t residual_stride = p.residual_token_stride ? p.residual_token_stride : row_elems;
  const int64_t num_rows = p.num_tokens * p.num_heads;
  const int64_t grain = 1 + 16384 / p.dim;  // enough work per item to amortize the hand-off
  parallel_chunks(pool, num_rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t token = row / p.num_heads;
      const int64_t head = row - token * p.num_heads;
      const float* x = f32(p.x) + token * x_stride + head * p.dim;
      float* out = f32(p.out) + token * out_stride + head * p.dim;
      if (p.residual == nullptr) {
        rms_norm_row(x, p.weight, out, p.dim, p.eps);
        continue;
      }
      // The same additions, then the same norm, as residual_add followed by rms_norm.
      float* residual = f32(p.residual) + token * residual_stride + head * p.dim;
      for (int64_t i = 0; i < p.dim; ++i) residual[i] += x[i];
      rms_norm_row(residual, p.weight, out, p.dim, p.eps);
    }
  });
}

}  // namespace fp8serve::cpu
