// SiLU·mul (SwiGLU), bias add and residual add: see kernels/cpu/ops.hpp.
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

void silu_mul_cpu(const SiluMulParams& p, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.dim < 0) throw std::invalid_argument("silu_mul_cpu: bad shape");
  const int64_t gate_stride = p.gate_token_stride ? p.gate_token_stride : p.dim;
  const int64_t up_stride = p.up_token_stride ? p.up_token_stride : p.dim;
  const int64_t out_stride = p.out_token_stride ? p.out_token_stride : p.dim;
  const int64_t grain = 1 + 8192 / (p.dim > 0 ? p.dim : 1);
  parallel_chunks(pool, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = f32(p.gate) + t * gate_stride;
      const float* up = f32(p.up) + t * up_stride;
      float* out = f32(p.out) + t * out_stride;
      for (int64_t i = 0; i < p.dim; ++i) {
        // torch's silu is x / (1 + exp(-x)); the product with up is a separate rounding.
        const float silu = gate[i] / (1.0f + std::exp(-gate[i]));
        out[i] = silu * up[i];
      }
    }
  });
}

void residual_add_cpu(const ResidualAddParams& p, ThreadPool& pool) {
  if (p.num_elements < 0) throw std::invalid_argument("residual_add_cpu: negative size");
  float* residual = f32(p.residual);
  const float* x = f32(p.x);
  parallel_chunks(pool, p.num_elements, 65536, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) residual[i] += x[i];
  });
}

}  // namespace fp8serve::cpu
