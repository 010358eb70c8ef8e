#pragma once
// The projections on a real GPU through cuBLASLt (linear_cublaslt.cpp): bf16 x and W, fp32
// accumulation (CUBLAS_COMPUTE_32F), bf16 y - or fp32 y for the LM head (LinearParams::y_fp32)
// - with Qwen2's QKV bias in the epilogue. The algorithm is chosen once per shape by
// cublasLtMatmulAlgoGetHeuristic and cached with its descriptors; one workspace serves every
// call. Real CUDA only: the emulated backend runs the portable GEMM (linear_portable.cu).
// Plain C++: no cuBLAS header leaks to the includer.
#include <cstddef>
#include <memory>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

class CublasLtLinear {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;

  // Creates the cuBLASLt handle and the workspace on the current device.
  explicit CublasLtLinear(std::size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // y = x @ W^T (+ bias) on `stream` (a cudaStream_t). Throws std::invalid_argument for a bad
  // shape, std::runtime_error when cuBLASLt fails or has no algorithm for the shape.
  void run(const LinearParams& params, void* stream);

  std::size_t num_cached_plans() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8serve::cuda
