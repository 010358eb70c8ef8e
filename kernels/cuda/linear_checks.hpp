#pragma once
// Host-side checks shared by the CUDA projections (the portable GEMM and cuBLASLt).
#include <stdexcept>
#include <string>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

// Throws std::invalid_argument for a bad shape or stride, and std::runtime_error for FP8
// weights (LinearParams::weight_dtype), which the CUDA projections do not run yet: the CUDA
// backend leaves Backend::supports_weight_dtype at bf16 only, so the model refuses FP8 weights
// at load and this is the kernels' own guard.
inline void check_linear_params(const LinearParams& p, const char* who) {
  if (p.num_tokens < 0 || p.in_features < 1 || p.out_features < 1 || p.x_stride < 0 || p.y_stride < 0 ||
      (p.x_stride != 0 && p.x_stride < p.in_features) || (p.y_stride != 0 && p.y_stride < p.out_features)) {
    throw std::invalid_argument(std::string(who) + ": bad shape or stride");
  }
  if (p.weight_dtype != WeightDtype::bf16) {
    throw std::runtime_error(std::string(who) +
                             ": FP8 weights are not supported on CUDA yet; serve this model without "
                             "--quantization fp8 (bf16 weights), or on the CPU");
  }
}

}  // namespace fp8serve::cuda
