// The emulator's cuBLASLt stand-in refuses what cuBLASLt refuses, with the status its
// documentation gives (cublaslt_checks.cpp cites each rule): every validation path of
// cublasLtMatmulAlgoGetHeuristic, cublasLtMatmul and the attribute calls, each checked for its
// status and for the rule that fired (cublaslt_last_failure), from a configuration that passes
// until the one change; a matrix past its allocation and a destroyed descriptor abort.
#include <cstdlib>
#include <string>

#include "tests/unit/cuda_emu/child_process.hpp"
#include "tests/unit/cuda_emu/cublaslt_case.hpp"

using namespace fp8serve::test;
using fp8serve::emu::cublaslt_last_failure;

namespace {

// The FP8 configuration the checks start from: passes as it is.
Gemm fp8_gemm() {
  Gemm g;
  g.a_type = g.b_type = CUDA_R_8F_E4M3;
  g.m = 32, g.n = 3, g.k = 64;
  g.a_scale = g.b_scale = true;
  return g;
}

// The heuristic's status for `g` after `change` (run on the case before the heuristic), and the
// reason must name `rule`.
template <class Change>
void heuristic_refuses(const Gemm& g, Change change, cublasStatus_t status, const std::string& rule) {
  LtCase c(g);
  change(c);
  const cublasStatus_t got = c.heuristic();
  INFO(cublasLtGetStatusName(got) << ": " << cublaslt_last_failure());
  CHECK(got == status);
  CHECK(cublaslt_last_failure().find(rule) != std::string::npos);
}

void heuristic_refuses(const Gemm& g, cublasStatus_t status, const std::string& rule) {
  heuristic_refuses(g, [](LtCase&) {}, status, rule);
}

// The heuristic passes; cublasLtMatmul after `change` gives `status` for `rule`.
template <class Change>
void matmul_refuses(const Gemm& g, Change change, cublasStatus_t status, const std::string& rule) {
  LtCase c(g);
  REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
  change(c);
  const cublasStatus_t got = c.matmul();
  INFO(cublasLtGetStatusName(got) << ": " << cublaslt_last_failure());
  CHECK(got == status);
  CHECK(cublaslt_last_failure().find(rule) != std::string::npos);
}

template <class T>
void set(LtCase& c, cublasLtMatmulDescAttributes_t attribute, T value) {
  set_attribute(c.desc(), attribute, value);
}

}  // namespace

TEST_CASE("the starting configurations pass") {
  for (const Gemm& g : {Gemm{}, fp8_gemm()}) {
    LtCase c(g);
    REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
    CHECK(c.algo_workspace == size_t{1} << 20);  // what the emulated algorithm uses of the 4 MiB allowed
    REQUIRE(c.matmul() == CUBLAS_STATUS_SUCCESS);
    CHECK(cublaslt_last_failure().empty());
    c.check_result();
  }
}

TEST_CASE("shapes and leading dimensions that conflict: CUBLAS_STATUS_INVALID_VALUE") {
  constexpr auto invalid = CUBLAS_STATUS_INVALID_VALUE;
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_T}); }, invalid,
                    "but op(B) is");
  heuristic_refuses(Gemm{}, [](LtCase& c) {
    const uint64_t rows = 9;  // D one row more than op(A)
    const int64_t ld = 9;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(3), CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(3), CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld) ==
            CUBLAS_STATUS_SUCCESS);
  }, invalid, "D is 9 x 4");
  heuristic_refuses(Gemm{}, [](LtCase& c) {
    const int64_t ld = 15;  // A is stored 16 x 8
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(0), CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld) ==
            CUBLAS_STATUS_SUCCESS);
  }, invalid, "leading dimension 15");
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{7}); }, invalid,
                    "not a cublasOperation_t");
  Gemm separate;
  separate.separate_c = true;
  heuristic_refuses(separate, [](LtCase& c) {
    const uint64_t cols = 5;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(2), CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols) ==
            CUBLAS_STATUS_SUCCESS);
  }, invalid, "C is 8 x 5");
  LtCase c(Gemm{});
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(c.handle(), c.desc(), c.layout(0), c.layout(1), c.layout(2), c.layout(3),
                                       c.pref(), 0, &result, &returned) == invalid);
  CHECK(cublasLtMatmulAlgoGetHeuristic(nullptr, c.desc(), c.layout(0), c.layout(1), c.layout(2), c.layout(3), c.pref(),
                                       1, &result, &returned) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatmulAlgoGetHeuristic(c.handle(), c.desc(), c.layout(0), c.layout(1), c.layout(2), c.layout(3),
                                       nullptr, 1, &result, &returned) == invalid);
}

TEST_CASE("cublasLtMatmul refuses an unsupported combination itself, with the heuristic's status") {
  matmul_refuses(Gemm{}, [](LtCase& c) {
    const uint32_t fp16 = CUDA_R_16F;  // B's type changed after the heuristic, no algorithm given
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(1), CUBLASLT_MATRIX_LAYOUT_TYPE, &fp16, sizeof fp16) ==
            CUBLAS_STATUS_SUCCESS);
    c.algo_ptr = nullptr;
  }, CUBLAS_STATUS_NOT_SUPPORTED, "no supported-types row");
  matmul_refuses(fp8_gemm(), [](LtCase& c) {
    // A stored m x k and not transposed: the same op(A), in an order sm_90's FP8 kernels lack.
    set(c, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_N});
    const uint64_t rows = 32, cols = 64;
    const int64_t ld = 32;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(0), CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(0), CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(0), CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld) ==
            CUBLAS_STATUS_SUCCESS);
  }, CUBLAS_STATUS_NOT_SUPPORTED, "FP8 on sm_90 needs TRANSA T and TRANSB N");
  matmul_refuses(fp8_gemm(), [](LtCase& c) {
    set(c, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(static_cast<const char*>(c.a_ptr()) + 2));
  }, CUBLAS_STATUS_INVALID_VALUE, "A_SCALE_POINTER is not float aligned");
}

TEST_CASE("type, compute and epilogue combinations no kernel has: CUBLAS_STATUS_NOT_SUPPORTED") {
  constexpr auto unsupported = CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm mixed;
  mixed.b_type = CUDA_R_16F;
  heuristic_refuses(mixed, unsupported, "no supported-types row");
  Gemm bf16_fp32c;  // C and D must match outside FP8
  bf16_fp32c.separate_c = true, bf16_fp32c.c_type = CUDA_R_32F;
  heuristic_refuses(bf16_fp32c, unsupported, "no supported-types row");
  Gemm fast;
  fast.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  heuristic_refuses(fast, unsupported, "compute type");
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_GELU}); },
                    unsupported, "epilogue");
  Gemm bias;
  bias.bias = true;
  heuristic_refuses(bias, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t{CUDA_R_32F}); },
                    unsupported, "BIAS_DATA_TYPE");
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_TRANSC, int32_t{CUBLAS_OP_T}); }, unsupported,
                    "TRANSC");
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, kOuter); }, unsupported,
                    "scale modes apply to FP8");
  heuristic_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{99}); },
                    CUBLAS_STATUS_INVALID_VALUE, "not a cublasLtMatmulMatrixScale_t");
  heuristic_refuses(Gemm{}, [](LtCase& c) {
    const int32_t batches = 2;
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(1), CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batches,
                                             sizeof batches) == CUBLAS_STATUS_SUCCESS);
  }, unsupported, "single column-major");
  heuristic_refuses(Gemm{}, [](LtCase& c) {
    set_preference(c.pref(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t{1});  // below a bf16
  }, unsupported, "MIN_ALIGNMENT_B_BYTES 1");
}

TEST_CASE("FP8 on sm_90: TN, compute 32F, 16-byte dimensions and pointers, the scale-mode pairs") {
  constexpr auto unsupported = CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm nn = fp8_gemm();
  nn.transa = false;
  heuristic_refuses(nn, unsupported, "TRANSA T and TRANSB N");
  Gemm odd_k = fp8_gemm();
  odd_k.k = 40;
  heuristic_refuses(odd_k, unsupported, "multiples of 16");
  Gemm odd_m = fp8_gemm();
  odd_m.m = 36;  // m * sizeof(bf16 C) = 72 bytes
  heuristic_refuses(odd_m, unsupported, "multiples of 16");
  Gemm pedantic = fp8_gemm();
  pedantic.compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  heuristic_refuses(pedantic, unsupported, "FP8 needs CUBLAS_COMPUTE_32F");
  Gemm e5m2 = fp8_gemm();
  e5m2.a_type = e5m2.b_type = CUDA_R_8F_E5M2;
  heuristic_refuses(e5m2, unsupported, "no supported-types row");
  heuristic_refuses(fp8_gemm(), [](LtCase& c) {
    set_preference(c.pref(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{8});
  }, unsupported, "no algorithm works below 16");
  const std::pair<int32_t, int32_t> no_kernel[] = {{kScalar, kOuter}, {kOuter, kVec128}, {kBlk128, kBlk128},
                                                   {kVec128, kScalar}, {CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0,
                                                                        CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0}};
  for (const auto& [a, b] : no_kernel) {
    INFO("A mode " << a << ", B mode " << b);
    Gemm g = fp8_gemm();
    g.a_mode = a, g.b_mode = b;
    heuristic_refuses(g, unsupported, "sm_90 has no FP8 kernel");
  }
  Gemm fp8_d = fp8_gemm();
  fp8_d.d_type = CUDA_R_8F_E4M3, fp8_d.separate_c = true, fp8_d.a_mode = fp8_d.b_mode = kOuter;
  heuristic_refuses(fp8_d, unsupported, "FP8 D is not supported with vector or block");
  heuristic_refuses(fp8_gemm(), [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_D_SCALE_MODE, kOuter); }, unsupported,
                    "C and D scales are SCALAR_32F");
}

TEST_CASE("cublasLtMatmul: pointers, alignment, scales, workspace, algorithm and stream") {
  constexpr auto invalid = CUBLAS_STATUS_INVALID_VALUE;
  Gemm bias;
  bias.bias = true;
  // A pointer less aligned than the preference promised (the algorithm assumed 16 bytes).
  matmul_refuses(Gemm{}, [](LtCase& c) { c.a_override = static_cast<const char*>(c.a_ptr()) + 8; }, invalid,
                 "A is 8-byte aligned, the algorithm was chosen for 16");
  // The bias pointer moved to a less aligned one after the heuristic read its alignment.
  matmul_refuses(bias, [](LtCase& c) {
    set(c, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(static_cast<const char*>(c.a_ptr()) + 2));
  }, invalid, "the bias pointer is 2-byte aligned");
  matmul_refuses(bias, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr)); },
                 invalid, "without a BIAS_POINTER");
  matmul_refuses(Gemm{}, [](LtCase& c) { c.workspace_bytes = c.algo_workspace - 256; }, invalid,
                 "is below the 1048576 the algorithm needs");
  matmul_refuses(Gemm{}, [](LtCase& c) { c.workspace_override = static_cast<char*>(c.workspace_ptr()) + 128; },
                 invalid, "not 256-byte aligned");
  matmul_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, c.a_ptr()); }, invalid,
                 "A_SCALE_POINTER is set but A and B are not FP8");
  matmul_refuses(fp8_gemm(), [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, c.a_ptr()); }, invalid,
                 "D_SCALE_POINTER is set but D is not FP8");
  matmul_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, c.d_ptr()); }, invalid,
                 "AMAX_D_POINTER");
  Gemm outer = fp8_gemm();
  outer.a_mode = outer.b_mode = kOuter;
  matmul_refuses(outer, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(nullptr)); },
                 invalid, "B_SCALE_MODE is a vector or block mode without a scale pointer");
  matmul_refuses(Gemm{}, [](LtCase& c) { c.algo.data[1] ^= 1; }, invalid, "not one cublasLtMatmulAlgoGetHeuristic");
  // An algorithm the heuristic chose without the bias, used with it.
  matmul_refuses(Gemm{}, [](LtCase& c) { set(c, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_BIAS});
                                         set(c, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.a_ptr()); },
                 invalid, "algo was chosen for other");
  Gemm in_place;
  in_place.beta = 1.0f;
  matmul_refuses(in_place, [](LtCase& c) {
    const int64_t ld = 9;  // C is D, but Cdesc says another leading dimension
    REQUIRE(cublasLtMatrixLayoutSetAttribute(c.layout(2), CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld) ==
            CUBLAS_STATUS_SUCCESS);
  }, invalid, "in place");
  // No algorithm given: an implicit heuristic with default preferences, which allow no workspace.
  matmul_refuses(Gemm{}, [](LtCase& c) { c.algo_ptr = nullptr; c.workspace_bytes = 0; c.workspace_override = nullptr; },
                 CUBLAS_STATUS_SUCCESS, "");

  LtCase c(Gemm{});
  REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f;
  CHECK(cublasLtMatmul(nullptr, c.desc(), &one, c.a_ptr(), c.layout(0), c.b_ptr(), c.layout(1), &one, c.c_ptr(),
                       c.layout(2), c.d_ptr(), c.layout(3), &c.algo, c.workspace_ptr(), c.workspace_bytes,
                       nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(cublasLtMatmul(c.handle(), c.desc(), nullptr, c.a_ptr(), c.layout(0), c.b_ptr(), c.layout(1), &one,
                       c.c_ptr(), c.layout(2), c.d_ptr(), c.layout(3), &c.algo, c.workspace_ptr(),
                       c.workspace_bytes, nullptr) == invalid);
  // A created stream works; a destroyed one fails the launch, as a GPU's launch would.
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  CHECK(c.matmul(stream) == CUBLAS_STATUS_SUCCESS);
  c.check_result();
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  (void)cudaGetLastError();
  CHECK(c.matmul(stream) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("attributes: sizes, null buffers, the size query, and what the stand-in does not model") {
  LtCase c(Gemm{});
  const int32_t op = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_TRANSA, &op, 2) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescSetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const void* aux = c.d_ptr();
  CHECK(cublasLtMatmulDescSetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  size_t written = 0;
  CHECK(cublasLtMatmulDescGetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(written == sizeof(void*));
  CHECK(cublasLtMatmulDescGetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, nullptr) ==
        CUBLAS_STATUS_INVALID_VALUE);
  int32_t transa = 0;
  CHECK(cublasLtMatmulDescGetAttribute(c.desc(), CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa, &written) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(transa == CUBLAS_OP_T);
  uint32_t alignment = 0;
  CHECK(cublasLtMatmulPreferenceGetAttribute(c.pref(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &alignment,
                                             sizeof alignment, nullptr) == CUBLAS_STATUS_SUCCESS);
  CHECK(alignment == 256);  // cublasLt.h's default
  uint64_t rows = 0;
  CHECK(cublasLtMatrixLayoutGetAttribute(c.layout(3), CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof rows, nullptr) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(rows == 8);
  CHECK(cublasLtCreate(nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtDestroy(nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) ==
        "an invalid numeric value was used as an argument");
}

TEST_CASE("a matrix past its allocation, or a destroyed descriptor, aborts with the operand named") {
  const ChildResult past = run_in_child([] {
    LtCase c(Gemm{});
    REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
    const int64_t ld = 32;  // A stored 16 x 8 with ld 32 spans more than its allocation
    cublasLtMatrixLayoutSetAttribute(c.layout(0), CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld);
    c.matmul();
  });
  CHECK(past.aborted);
  CHECK(past.stderr_text.find("cublasLtMatmul: A at") != std::string::npos);
  const ChildResult destroyed = run_in_child([] {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescDestroy(desc);
    const int32_t op = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op);
  });
  CHECK(destroyed.aborted);
  CHECK(destroyed.stderr_text.find("is not a live cuBLASLt matmul descriptor") != std::string::npos);
}

TEST_CASE("another device presented (FP8SERVE_EMU_SM): no FP8 before sm_89, the vector scale modes only on sm_90") {
  constexpr auto unsupported = CUBLAS_STATUS_NOT_SUPPORTED;
  Gemm outer = fp8_gemm();
  outer.a_mode = outer.b_mode = kOuter;
  ::setenv("FP8SERVE_EMU_SM", "80", 1);
  int major = 0;
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  CHECK(major == 8);
  heuristic_refuses(fp8_gemm(), unsupported, "FP8 matmuls need sm_89 or later");
  ::setenv("FP8SERVE_EMU_SM", "100", 1);
  heuristic_refuses(outer, unsupported, "scale modes are sm_90's");
  LtCase scalar(fp8_gemm());  // scalar scales: any FP8 device
  CHECK(scalar.heuristic() == CUBLAS_STATUS_SUCCESS);
  ::unsetenv("FP8SERVE_EMU_SM");
  LtCase hopper(outer);
  CHECK(hopper.heuristic() == CUBLAS_STATUS_SUCCESS);
}
