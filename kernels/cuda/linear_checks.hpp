#pragma once
// Host-side checks shared by the CUDA projections (the portable GEMM and cuBLASLt).
#include <stdexcept>
#include <string>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

// Throws std::invalid_argument for a bad shape or stride, and std::runtime_error for FP8
// weights (LinearParams::weight_dtype, from the FP8-weights branch), which the CUDA projections
// do not run yet. A template so that it compiles whether or not LinearParams has that field.
template <class Params>
void check_linear_params(const Params& p, const char* who) {
  if (p.num_tokens < 0 || p.in_features < 1 || p.out_features < 1 || p.x_stride < 0 || p.y_stride < 0 ||
      (p.x_stride != 0 && p.x_stride < p.in_features) || (p.y_stride != 0 && p.y_stride < p.out_features)) {
    throw std::invalid_argument(std::string(who) + ": bad shape or stride");
  }
  if constexpr (requires { p.weight_dtype; }) {
    if (static_cast<int>(p.weight_dtype) != 0) {  // WeightDtype::bf16 is the first enumerator
      throw std::runtime_error(std::string(who) +
                               ": FP8 weights are not supported on CUDA yet; serve this model without "
                               "--quantization fp8 (bf16 weights), or on the CPU");
    }
  }
}

}  // namespace fp8serve::cuda
