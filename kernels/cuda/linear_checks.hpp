#pragma once
// Host-side checks shared by the CUDA projections (the FP8 GEMV and cuBLASLt).
#include <stdexcept>
#include <string>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

// Throws std::invalid_argument for a bad shape or stride, or FP8 weights without their scales
// or with a block that is not a multiple of 64 inputs; with allow_fp8 false (cuBLASLt, which
// runs bf16 weights only for now), std::runtime_error for FP8 weights.
inline void check_linear_params(const LinearParams& p, const char* who, bool allow_fp8 = true) {
  if (p.num_tokens < 0 || p.in_features < 1 || p.out_features < 1 || p.x_stride < 0 || p.y_stride < 0 ||
      (p.x_stride != 0 && p.x_stride < p.in_features) || (p.y_stride != 0 && p.y_stride < p.out_features)) {
    throw std::invalid_argument(std::string(who) + ": bad shape or stride");
  }
  if (p.weight_dtype == WeightDtype::fp8_e4m3) {
    if (!allow_fp8) throw std::runtime_error(std::string(who) + ": FP8 weights go to the FP8 GEMV");
    if (p.weight_scales == nullptr || p.weight_block_k < 0 || p.weight_block_k % 64 != 0) {
      throw std::invalid_argument(std::string(who) + ": FP8 weights need scales and a block of a multiple of 64");
    }
  } else if (p.weight_dtype != WeightDtype::bf16) {
    throw std::invalid_argument(std::string(who) + ": unknown weight dtype");
  }
}

}  // namespace fp8serve::cuda
