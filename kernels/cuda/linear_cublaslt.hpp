#pragma once
// The projections on a real GPU through cuBLASLt (linear_cublaslt.cpp): bf16 x and W, fp32
// accumulation (CUBLAS_COMPUTE_32F), bf16 y - or fp32 y for the LM head (LinearParams::y_fp32)
// - with Qwen2's QKV bias in the epilogue. The algorithm is chosen once per shape by
// cublasLtMatmulAlgoGetHeuristic and cached with its descriptors (an LRU of max_plans shapes: token
// counts vary without bound); one workspace serves every call. Both builds compile it: the emulated
// one against the CPU emulator's cuBLASLt stand-in (tests/cuda_emu/cublaslt.cpp), which checks each
// call as cuBLASLt's documentation states. Plain C++: no cuBLAS header leaks to the includer.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/forward_ops.hpp"

namespace fp8serve::cuda {

// The activation side of an FP8 GEMM (CublasLtLinear::run_fp8): x quantized to E4M3 by
// fp8_quantize_act_cuda (ops_cuda.hpp), and the weights' scales in the mode's layout.
struct Fp8GemmOperands {
  const void* x_codes = nullptr;     // [num_tokens, x_ld] E4M3
  int64_t x_ld = 0;                  // a multiple of 16
  const float* x_scales = nullptr;   // per token [num_tokens], or block128: [k_blocks, pad4(num_tokens)]
  const float* w_scales = nullptr;   // per row [out], or block128: [k_blocks, pad4(out)]
  bool block128 = false;             // VEC128_32F on both operands, else OUTER_VEC_32F on both
};

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

  // y = x @ W^T (+ bias) for FP8 W (params.weight, E4M3 codes) on cuBLASLt's FP8 GEMM: E4M3 x E4M3,
  // CUBLAS_COMPUTE_32F, bf16 or fp32 y, scales through the scale modes (q). params.x is not read.
  // PRECOND: fp8_gemm_available() and fp8_gemm_supported(params).
  void run_fp8(const LinearParams& params, const Fp8GemmOperands& q, void* stream);
  // Whether sm_90's FP8 GEMM takes these FP8 weights: one scale per row or 128-input blocks (no
  // other block size has a scale mode), in_features a multiple of 16 (and <= 16384 with one scale
  // per row: the activation quantizer's row), out_features and the y row stride multiples of 16
  // bytes, W and y 16-byte aligned (cuBLASLt's FP8 rules, tests/cuda_emu/cublaslt_checks.cpp).
  static bool fp8_gemm_supported(const LinearParams& params);
  // Whether this device has that GEMM at all: sm_90 and cuBLASLt 12.9 or later (decided at
  // construction). Elsewhere FP8 weights run on the GEMV (CudaBackend::linear), never a throw.
  bool fp8_gemm_available() const;
  static bool device_has_fp8_gemm();  // the current device's answer, asked now

  std::size_t num_cached_plans() const;  // at most max_plans

 private:
  // y = op(W) b (+ bias) with b = x (bf16) or its E4M3 codes (fp8 set).
  void matmul(const LinearParams& params, const void* b, int64_t ldb, const Fp8GemmOperands* fp8, void* stream);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8serve::cuda
