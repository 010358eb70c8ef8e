#pragma once
// The projections on a real GPU through cuBLASLt (linear_cublaslt.cpp): bf16 x and W, fp32
// accumulation (CUBLAS_COMPUTE_32F), bf16 y - or fp32 y for the LM head (LinearParams::y_fp32)
// - with Qwen2's QKV bias in the epilogue. The algorithm is chosen once per shape by
// cublasLtMatmulAlgoGetHeuristic and cached with its descriptors (an LRU of max_plans shapes:
// token counts vary without bound); one workspace serves every call. Both builds compile it: the
// emulated one against the CPU emulator's cuBLASLt stand-in (emu/cublaslt.cpp), which checks
// each call as cuBLASLt's documentation states. Plain C++: no cuBLAS header leaks to the includer.
#include <cstddef>
#include <memory>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

class CublasLtLinear {
 public:
  static constexpr std::size_t kDefaultWorkspaceBytes = std::size_t{32} << 20;
  // A model's ~6 projection shapes times ~40 token counts (the decode batch sizes and recent
  // prefill chunks) before a miss; a plan is a few hundred bytes of host memory, and a miss costs
  // one heuristic query on the host.
  static constexpr std::size_t kDefaultMaxPlans = 256;

  // Creates the cuBLASLt handle and the workspace on the current device. max_plans >= 1.
  explicit CublasLtLinear(std::size_t workspace_bytes = kDefaultWorkspaceBytes,
                          std::size_t max_plans = kDefaultMaxPlans);
  ~CublasLtLinear();
  CublasLtLinear(const CublasLtLinear&) = delete;
  CublasLtLinear& operator=(const CublasLtLinear&) = delete;

  // y = x @ W^T (+ bias) on `stream` (a cudaStream_t). Throws std::invalid_argument for a bad
  // shape, std::runtime_error when cuBLASLt fails or has no algorithm for the shape.
  void run(const LinearParams& params, void* stream);

  std::size_t num_cached_plans() const;  // at most max_plans

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8serve::cuda
