// cuBLASLt projections: see linear_cublaslt.hpp.
//
// The transposes. Our matrices are row-major: x [T, K] (row stride x_stride), W [O, K] (row
// stride K, as HF stores nn.Linear weights), y [T, O] (row stride y_stride), y = x W^T.
// cuBLASLt is column-major, and a row-major [R, C] matrix with row stride ld is exactly the
// column-major [C, R] matrix with leading dimension ld. So, in cuBLASLt's terms:
//   A = W seen as column-major [K, O], ld K,         transa = T  -> op(A) = [O, K]
//   B = x seen as column-major [K, T], ld x_stride,  transb = N  -> op(B) = [K, T]
//   D = y seen as column-major [O, T], ld y_stride:  D = op(A) op(B),  m = O, n = T, k = K
// (the "TN" GEMM cuBLAS is fastest at). The bias epilogue adds a vector of length m - one value
// per output feature, broadcast over the tokens - which is Qwen2's QKV bias. Its element type
// is D's, so it serves bf16 outputs; an fp32 output with a bias (no model has one: the LM head
// carries none) gets the bias from a small kernel afterwards.
#include "kernels/cuda/linear_cublaslt.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <list>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/linear_checks.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/emulator_hook.hpp"  // emu::cublaslt_last_failure, emulated build only

namespace fp8serve::cuda {
namespace {
// The emulator's stand-in also says which documented rule refused a call.
std::string cublaslt_reason() {
#if FP8SERVE_CUDA_EMU
  return "; the emulator's cuBLASLt stand-in: " + emu::cublaslt_last_failure();
#else  // coverage: the real build's (empty) reason; the emulated one is tested
  return "";
#endif
}
}  // namespace
}  // namespace fp8serve::cuda

#define CUBLASLT_CHECK(call)                                                                          \
  do {                                                                                                \
    const cublasStatus_t fp8serve_status_ = (call);                                                   \
    if (fp8serve_status_ != CUBLAS_STATUS_SUCCESS) {                                                  \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + #call + \
                               " failed: " + cublasLtGetStatusName(fp8serve_status_) + " (" +         \
                               cublasLtGetStatusString(fp8serve_status_) + ")" + cublaslt_reason());  \
    }                                                                                                 \
  } while (0)

namespace fp8serve::cuda {

// A named namespace, not an anonymous one: CublasLtLinear::Impl holds these types, and the
// emulated build compiles this file through an #include, where GCC warns of subobjects of
// anonymous-namespace types (-Wsubobject-linkage).
namespace lt_plans {

// Largest power of two (<= 256) that divides the address: what the heuristic may assume.
inline uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// FP8 GEMMs: E4M3 A and B with both operands' scales in one mode.
enum class Fp8Mode : uint8_t { none, outer_vec, vec128 };

struct PlanKey {
  int64_t m, n, k, lda, ldb, ldd;
  bool y_fp32, bias;
  Fp8Mode fp8;
  uint32_t align_a, align_b, align_d, align_bias;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix(static_cast<uint64_t>(key.lda));
    mix(static_cast<uint64_t>(key.ldb));
    mix(static_cast<uint64_t>(key.ldd));
    mix((key.y_fp32 ? 1u : 0u) | (key.bias ? 2u : 0u) | (static_cast<uint64_t>(key.fp8) << 2));
    mix((uint64_t{key.align_a} << 32) | (uint64_t{key.align_b} << 16) | key.align_d | (uint64_t{key.align_bias} << 48));
    return h;
  }
};

// The descriptors of one shape and the algorithm the heuristic chose for it.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

}  // namespace lt_plans

using lt_plans::Plan;
using lt_plans::PlanKey;
using lt_plans::PlanKeyHash;
using lt_plans::alignment_of;
using lt_plans::Fp8Mode;

// The plan cache. A plan's layouts carry the exact token count, and prefill chunk sizes vary
// without bound, so it is an LRU of max_plans. (Plans per token-count bucket, with the exact count
// set per call through cublasLtMatrixLayoutSetAttribute, would query the heuristic less, but
// cuBLASLt's documentation does not promise that an algorithm chosen for one shape is valid for
// another - cublasLtMatmulAlgoCheck exists to ask - so every shape gets its own query.) Evicting a
// plan that a CUDA graph captured is safe: the graph keeps the kernels' arguments, not the
// descriptors.
struct CublasLtLinear::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::size_t max_plans = 0;
  bool fp8_gemm = false;  // the device and the library have the scale modes run_fp8 uses
  std::list<std::pair<PlanKey, std::unique_ptr<Plan>>> plans;  // most recently used first
  std::unordered_map<PlanKey, decltype(plans)::iterator, PlanKeyHash> index;

  // The pointers the heuristic may look at (their alignment), set again before every call.
  struct Pointers {
    const std::uint16_t* bias = nullptr;
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
  };

  Plan& plan_for(const PlanKey& key, const Pointers& pointers) {
    if (const auto it = index.find(key); it != index.end()) {
      plans.splice(plans.begin(), plans, it->second);
      return *plans.front().second;
    }
    plans.emplace_front(key, make_plan(key, pointers));
    index.emplace(key, plans.begin());
    if (plans.size() > max_plans) {
      index.erase(plans.back().first);
      plans.pop_back();
    }
    return *plans.front().second;
  }

  static void set_pointers(Plan& plan, const PlanKey& key, const Pointers& pointers) {
    if (key.bias) {
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pointers.bias,
                                                    sizeof pointers.bias));
    }
    if (key.fp8 != Fp8Mode::none) {
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pointers.a_scale,
                                                    sizeof pointers.a_scale));
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pointers.b_scale,
                                                    sizeof pointers.b_scale));
    }
  }

  std::unique_ptr<Plan> make_plan(const PlanKey& key, const Pointers& pointers) {
    auto plan = std::make_unique<Plan>();
    CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transa = CUBLAS_OP_T;
    const cublasOperation_t transb = CUBLAS_OP_N;
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    if (key.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      const int32_t bias_type = CUDA_R_16BF;
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof bias_type));
    }
    if (key.fp8 != Fp8Mode::none) {
      // Both operands' scales in one mode: OUTER_VEC_32F (A: one per row of W, B: one per token)
      // or VEC128_32F (one per row and 128-input block of each). sm_90 pairs these (1-D x 1-D
      // blocks); a D scale is SCALAR only and an FP8 D is refused with vector modes: y stays bf16.
      const int32_t mode = key.fp8 == Fp8Mode::vec128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                      : CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
      CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    }
    // The heuristic reads the pointers' alignment from the descriptor.
    set_pointers(*plan, key, pointers);
    const cudaDataType_t d_type = key.y_fp32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t ab_type = key.fp8 != Fp8Mode::none ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, ab_type, static_cast<uint64_t>(key.k),
                                              static_cast<uint64_t>(key.m), key.lda));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, ab_type, static_cast<uint64_t>(key.k),
                                              static_cast<uint64_t>(key.n), key.ldb));
    CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->d, d_type, static_cast<uint64_t>(key.m),
                                              static_cast<uint64_t>(key.n), key.ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    struct PrefGuard {
      cublasLtMatmulPreference_t p;
      ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
    } guard{pref};
    const uint64_t max_workspace = workspace_bytes;
    CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                        sizeof max_workspace));
    auto set_alignment = [&](cublasLtMatmulPreferenceAttributes_t attribute, uint32_t bytes) {
      CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes));
    };
    set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a);
    set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b);
    set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d);
    set_alignment(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1,
                                                  &result, &returned));
    if (returned == 0) {  // coverage: cuBLASLt answers NOT_SUPPORTED when it has no algorithm (above)
      throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(key.n) + " x " +
                               std::to_string(key.k) + " x " + std::to_string(key.m) +
                               (key.fp8 != Fp8Mode::none ? " FP8" : " bf16") +
                               " GEMM (tokens x in x out) with these strides and alignments");
    }
    plan->algo = result.algo;
    return plan;
  }
};

CublasLtLinear::CublasLtLinear(std::size_t workspace_bytes, std::size_t max_plans) : impl_(std::make_unique<Impl>()) {
  if (max_plans == 0) throw std::invalid_argument("CublasLtLinear: max_plans must be at least 1");
  CUBLASLT_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  impl_->max_plans = max_plans;
  // OUTER_VEC_32F and VEC128_32F (run_fp8's scale modes) are sm_90's, from cuBLAS 12.9 on; sm_80
  // has no FP8 GEMM and Blackwell's block scales are other modes (VEC16_UE4M3, VEC32_UE8M0).
  impl_->fp8_gemm = device_has_fp8_gemm();
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMalloc(&impl_->workspace, workspace_bytes);
    if (err != cudaSuccess) {
      cublasLtDestroy(impl_->handle);
      throw_cuda_error(err, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
    }
  }
}

CublasLtLinear::~CublasLtLinear() {
  impl_->index.clear();
  impl_->plans.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

std::size_t CublasLtLinear::num_cached_plans() const { return impl_->plans.size(); }

void CublasLtLinear::run(const LinearParams& p, void* stream) {
  check_linear_params(p, "linear (cuBLASLt)", /*allow_fp8=*/false);
  matmul(p, p.x, p.x_stride ? p.x_stride : p.in_features, nullptr, stream);
}

void CublasLtLinear::run_fp8(const LinearParams& p, const Fp8GemmOperands& q, void* stream) {
  if (!fp8_gemm_available())
    throw std::invalid_argument("linear (cuBLASLt FP8): this device has no FP8 GEMM with per-row or 128-block scales (sm_90 only)");
  check_linear_params(p, "linear (cuBLASLt FP8)");
  if (p.weight_dtype != WeightDtype::fp8_e4m3 || !fp8_gemm_supported(p))
    throw std::invalid_argument("linear (cuBLASLt FP8): FP8 weights in a shape sm_90's FP8 GEMM takes only");
  matmul(p, q.x_codes, q.x_ld, &q, stream);
}

bool CublasLtLinear::fp8_gemm_available() const { return impl_->fp8_gemm; }

bool CublasLtLinear::device_has_fp8_gemm() {
  int device = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0 && cublasLtGetVersion() >= 120900;
}

bool CublasLtLinear::fp8_gemm_supported(const LinearParams& p) {
  const bool per_row = p.weight_block_k == 0 || p.weight_block_k >= p.in_features;
  const int64_t y_size = p.y_fp32 ? 4 : 2;
  const int64_t y_stride = p.y_stride ? p.y_stride : p.out_features;
  return (per_row ? p.in_features <= 16384 : p.weight_block_k == 128) && p.in_features % 16 == 0 &&
         (p.out_features * y_size) % 16 == 0 && (y_stride * y_size) % 16 == 0 && alignment_of(p.weight) >= 16 &&
         alignment_of(p.y) >= 16;
}

void CublasLtLinear::matmul(const LinearParams& p, const void* b, int64_t ldb, const Fp8GemmOperands* fp8,
                            void* stream) {
  if (p.num_tokens == 0) return;
  const bool epilogue_bias = p.bias != nullptr && !p.y_fp32;
  PlanKey key{};
  key.m = p.out_features;
  key.n = p.num_tokens;
  key.k = p.in_features;
  key.lda = p.in_features;
  key.ldb = ldb;
  key.ldd = p.y_stride ? p.y_stride : p.out_features;
  key.y_fp32 = p.y_fp32;
  key.bias = epilogue_bias;
  key.fp8 = fp8 == nullptr ? Fp8Mode::none : fp8->block128 ? Fp8Mode::vec128 : Fp8Mode::outer_vec;
  key.align_a = alignment_of(p.weight);
  key.align_b = alignment_of(b);
  key.align_d = alignment_of(p.y);
  key.align_bias = epilogue_bias ? alignment_of(p.bias) : 0;
  Impl::Pointers pointers;
  pointers.bias = epilogue_bias ? p.bias : nullptr;
  if (fp8 != nullptr) {
    pointers.a_scale = fp8->w_scales;
    pointers.b_scale = fp8->x_scales;
  }
  Plan& plan = impl_->plan_for(key, pointers);
  Impl::set_pointers(plan, key, pointers);
  const float alpha = 1.0f;
  const float beta = 0.0f;
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  CUBLASLT_CHECK(cublasLtMatmul(impl_->handle, plan.desc, &alpha, p.weight, plan.a, b, plan.b, &beta, p.y, plan.d,
                                p.y, plan.d, &plan.algo, impl_->workspace, impl_->workspace_bytes, cuda_stream));
  if (p.bias != nullptr && p.y_fp32) {
    add_bias_f32_cuda(static_cast<float*>(p.y), key.ldd, p.bias, p.num_tokens, p.out_features, cuda_stream);
  }
}

}  // namespace fp8serve::cuda
