// The emulator's cuBLASLt stand-in computes what cublasLtMatmul is documented to compute: bf16,
// fp16, fp32 and FP8 (E4M3, E5M2) GEMMs in every transpose, with strides, odd shapes, alpha and
// beta, in-place and separate C, the BIAS epilogue, fp32 / bf16 / FP8 D, and each FP8 scale mode
// of sm_90, all against a double-precision host reference (cublaslt_case.hpp); a captured call
// runs at each graph launch; and linear_cublaslt.cpp's row/column mapping, transposed, is refused
// or gives a wrong y (the injected bug of issue 20: see docs/cuda.md, "The CUDA emulator").
#include <cstdio>

#include "tests/unit/cuda_emu/cublaslt_case.hpp"

using namespace fp8serve::test;

namespace {

void run_and_check(const Gemm& g, const char* what, uint32_t seed = 1) {
  INFO(what);
  LtCase c(g, seed);
  const cublasStatus_t planned = c.heuristic();
  INFO(fp8serve::emu::cublaslt_last_failure());
  REQUIRE(planned == CUBLAS_STATUS_SUCCESS);
  const cublasStatus_t ran = c.matmul();
  INFO(fp8serve::emu::cublaslt_last_failure());
  REQUIRE(ran == CUBLAS_STATUS_SUCCESS);
  const double worst = c.check_result();
  std::printf("[cublaslt] %-58s worst error / bound %.3f\n", what, worst);
}

}  // namespace

TEST_CASE("bf16, fp16 and fp32 GEMMs: every transpose, strides, odd shapes, bias, alpha and beta") {
  for (const bool transa : {true, false}) {
    for (const bool transb : {false, true}) {
      Gemm g;
      g.m = 37, g.n = 5, g.k = 100;
      g.transa = transa, g.transb = transb;
      g.lda_pad = 3, g.ldb_pad = 5, g.ldd_pad = 7;
      g.bias = true;
      run_and_check(g, transa ? (transb ? "bf16 TT + bias, strided" : "bf16 TN + bias, strided")
                              : (transb ? "bf16 NT + bias, strided" : "bf16 NN + bias, strided"));
    }
  }
  Gemm in_place;  // D = 0.5 A B - 1.25 D, in place
  in_place.m = 24, in_place.n = 3, in_place.k = 70, in_place.alpha = 0.5f, in_place.beta = -1.25f;
  run_and_check(in_place, "bf16 TN, alpha 0.5, beta -1.25, C == D");
  Gemm fp32_d;  // bf16 inputs, fp32 D and C (separate, strided), fp32 bias (the table's)
  fp32_d.m = 19, fp32_d.n = 6, fp32_d.k = 33, fp32_d.c_type = fp32_d.d_type = CUDA_R_32F;
  fp32_d.separate_c = true, fp32_d.ldc_pad = 2, fp32_d.ldd_pad = 1, fp32_d.beta = 0.75f, fp32_d.bias = true;
  run_and_check(fp32_d, "bf16 -> fp32 D, separate strided C, fp32 bias");
  Gemm fp16;
  fp16.a_type = fp16.b_type = fp16.c_type = fp16.d_type = CUDA_R_16F;
  fp16.m = 9, fp16.n = 4, fp16.k = 40, fp16.bias = true, fp16.transa = false;
  run_and_check(fp16, "fp16 NN + fp16 bias");
  Gemm fp32;
  fp32.a_type = fp32.b_type = fp32.c_type = fp32.d_type = CUDA_R_32F;
  fp32.m = 13, fp32.n = 2, fp32.k = 300, fp32.transb = true, fp32.compute = CUBLAS_COMPUTE_32F_PEDANTIC;
  run_and_check(fp32, "fp32 TT, COMPUTE_32F_PEDANTIC");
}

TEST_CASE("beta 0 never reads C: a NaN C leaves D finite") {
  Gemm g;
  g.m = 16, g.n = 3, g.k = 20, g.separate_c = true;
  LtCase c(g);
  REQUIRE(cudaMemset(const_cast<void*>(c.c_ptr()), 0xff, 16 * 3 * 2) == cudaSuccess);  // NaN bf16
  REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
  REQUIRE(c.matmul() == CUBLAS_STATUS_SUCCESS);
  c.check_result();
}

TEST_CASE("FP8 GEMMs (TN) in each scale mode of sm_90, with bias, fp32, bf16 and FP8 D") {
  Gemm scalar;  // E4M3 x E4M3 -> bf16, tensor-wide scales, bias, strided
  scalar.a_type = scalar.b_type = CUDA_R_8F_E4M3;
  scalar.m = 48, scalar.n = 7, scalar.k = 288, scalar.lda_pad = 16, scalar.ldb_pad = 32, scalar.ldd_pad = 8;
  scalar.a_scale = scalar.b_scale = true, scalar.bias = true;
  run_and_check(scalar, "E4M3 SCALAR_32F scales -> bf16 + bias");
  Gemm unscaled = scalar;
  unscaled.a_scale = unscaled.b_scale = false;
  run_and_check(unscaled, "E4M3 without scale pointers (scales 1)");
  Gemm outer = scalar;
  outer.a_mode = outer.b_mode = kOuter;
  run_and_check(outer, "E4M3 OUTER_VEC_32F x OUTER_VEC_32F -> bf16 + bias");
  Gemm vec = scalar;  // 1D blocks: k 288 = two full blocks and a partial one
  vec.m = 136, vec.n = 9, vec.a_mode = vec.b_mode = kVec128;
  run_and_check(vec, "E4M3 VEC128_32F x VEC128_32F, partial k block");
  Gemm blk_a = vec;  // 2D A blocks: m 136 = a full and a partial block
  blk_a.a_mode = kBlk128;
  run_and_check(blk_a, "E4M3 BLK128x128_32F x VEC128_32F");
  Gemm blk_b = vec;
  blk_b.m = 24, blk_b.n = 136, blk_b.b_mode = kBlk128;
  run_and_check(blk_b, "E4M3 VEC128_32F x BLK128x128_32F");
  Gemm fp32_d = scalar;  // fp32 D and C (separate, scaled), bf16 bias (the FP8 table's)
  fp32_d.c_type = fp32_d.d_type = CUDA_R_32F;
  fp32_d.separate_c = true, fp32_d.beta = 0.5f, fp32_d.c_scale = true, fp32_d.ldd_pad = 4;
  run_and_check(fp32_d, "E4M3 -> fp32 D, scaled C, bf16 bias");
  Gemm fp8_d = scalar;  // FP8 D: scaled, saturating, with the amax of the unscaled result
  fp8_d.d_type = CUDA_R_8F_E4M3, fp8_d.separate_c = true, fp8_d.ldd_pad = 16;
  fp8_d.d_scale = fp8_d.amax = true, fp8_d.beta = 1.0f;
  run_and_check(fp8_d, "E4M3 -> E4M3 D with D scale, AMAX_D, bf16 C");
  Gemm e5m2 = scalar;
  e5m2.a_type = CUDA_R_8F_E5M2, e5m2.d_type = CUDA_R_8F_E5M2, e5m2.separate_c = true, e5m2.bias = false;
  e5m2.ldd_pad = 16;  // ldd * 1 byte a multiple of 16
  run_and_check(e5m2, "E5M2 x E4M3 -> E5M2 D");
}

TEST_CASE("a captured cublasLtMatmul runs at each graph launch, on the memory of that launch") {
  Gemm g;
  g.m = 16, g.n = 4, g.k = 32, g.bias = true;
  LtCase c(g);
  REQUIRE(c.heuristic() == CUBLAS_STATUS_SUCCESS);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  REQUIRE(c.matmul(stream) == CUBLAS_STATUS_SUCCESS);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  const std::vector<uint8_t> untouched = download(c.d_ptr(), static_cast<size_t>(c.ldd() * g.n * 2));
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](uint8_t v) { return v == 0x5a; }));  // recorded, not run
  // New B after the capture: the replay reads it, as a real graph does.
  std::mt19937 rng(7);
  c.host_b() = random_elements(CUDA_R_16BF, c.host_b().size() / 2, rng);
  // On the graph's stream: a plain cudaMemcpy from pageable memory lands on the legacy stream,
  // which the non-blocking stream does not wait for.
  REQUIRE(cudaMemcpyAsync(const_cast<void*>(c.b_ptr()), c.host_b().data(), c.host_b().size(), cudaMemcpyHostToDevice,
                          stream) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  c.check_result();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// linear_cublaslt.cpp maps row-major y [T, O] = x [T, K] W^T (W [O, K]) onto column-major
// cuBLASLt as A = W seen as [K, O] (ld K) with TRANSA T, B = x seen as [K, T] (ld K), D = y seen
// as [O, T] (ld O). Each way of getting that mapping wrong is refused or computes a wrong y.
TEST_CASE("linear_cublaslt.cpp's row/column mapping, transposed, is refused or gives a wrong y", "[injected]") {
  struct Mapping {
    const char* what;
    bool swap_ab;       // x as A and W as B
    int32_t transa;     // on A
    bool w_as_o_by_k;   // W seen as column-major [O, K] (ld O): the row/column confusion
  };
  const Mapping mappings[] = {
      {"the project's mapping", false, CUBLAS_OP_T, false},
      {"TRANSA N", false, CUBLAS_OP_N, false},
      {"A and B swapped", true, CUBLAS_OP_T, false},
      {"W read as column-major [O, K], TRANSA N", false, CUBLAS_OP_N, true},
  };
  for (const int64_t tokens : {int64_t{5}, int64_t{48}}) {  // 48: square, so a swap is not a shape error
    const int64_t k = 64, o = 48;
    std::mt19937 rng(11);
    const std::vector<uint8_t> x = random_elements(CUDA_R_16BF, static_cast<size_t>(tokens * k), rng);
    const std::vector<uint8_t> w = random_elements(CUDA_R_16BF, static_cast<size_t>(o * k), rng);
    std::vector<double> y(static_cast<size_t>(tokens * o));  // y[t, o] = sum_k x[t, k] w[o, k]
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < o; ++j)
        for (int64_t l = 0; l < k; ++l)
          y[static_cast<size_t>(t * o + j)] += decode(CUDA_R_16BF, x, static_cast<size_t>(t * k + l)) *
                                               decode(CUDA_R_16BF, w, static_cast<size_t>(j * k + l));
    const DevicePtr dx = upload(x.data(), x.size()), dw = upload(w.data(), w.size());
    const DevicePtr dy = upload(nullptr, y.size() * 2);
    for (const Mapping& m : mappings) {
      INFO(m.what << ", " << tokens << " tokens");
      cublasLtHandle_t handle = nullptr;
      cublasLtMatmulDesc_t desc = nullptr;
      REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
      set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, m.transa);
      set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(CUBLAS_OP_N));
      cublasLtMatrixLayout_t lw = nullptr, lx = nullptr, ly = nullptr;
      if (m.w_as_o_by_k) {
        REQUIRE(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16BF, o, k, o) == CUBLAS_STATUS_SUCCESS);
      } else {
        REQUIRE(cublasLtMatrixLayoutCreate(&lw, CUDA_R_16BF, k, o, k) == CUBLAS_STATUS_SUCCESS);
      }
      REQUIRE(cublasLtMatrixLayoutCreate(&lx, CUDA_R_16BF, k, tokens, k) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(cublasLtMatrixLayoutCreate(&ly, CUDA_R_16BF, o, tokens, o) == CUBLAS_STATUS_SUCCESS);
      cublasLtMatmulPreference_t pref = nullptr;
      REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
      cublasLtMatmulHeuristicResult_t result{};
      int returned = 0;
      const cublasLtMatrixLayout_t la = m.swap_ab ? lx : lw, lb = m.swap_ab ? lw : lx;
      const cublasStatus_t planned =
          cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ly, ly, pref, 1, &result, &returned);
      const float alpha = 1.0f, beta = 0.0f;
      cublasStatus_t ran = planned;
      if (planned == CUBLAS_STATUS_SUCCESS) {
        ran = cublasLtMatmul(handle, desc, &alpha, m.swap_ab ? dx.get() : dw.get(), la, m.swap_ab ? dw.get() : dx.get(),
                             lb, &beta, dy.get(), ly, dy.get(), ly, &result.algo, nullptr, 0, nullptr);
      }
      size_t wrong = 0;
      if (ran == CUBLAS_STATUS_SUCCESS) {
        const std::vector<uint8_t> got = download(dy.get(), y.size() * 2);
        for (size_t i = 0; i < y.size(); ++i) wrong += std::fabs(decode(CUDA_R_16BF, got, i) - y[i]) > 0.05 + 0.01 * std::fabs(y[i]);
      }
      const bool correct = ran == CUBLAS_STATUS_SUCCESS && wrong == 0;
      std::printf("[cublaslt injected] %-42s %2lld tokens: %s\n", m.what, static_cast<long long>(tokens),
                  ran != CUBLAS_STATUS_SUCCESS ? ("refused: " + fp8serve::emu::cublaslt_last_failure()).c_str()
                                               : (std::to_string(wrong) + " of " + std::to_string(y.size()) +
                                                  " elements of y wrong").c_str());
      if (m.transa == CUBLAS_OP_T && !m.swap_ab) {
        CHECK(correct);
      } else {
        CHECK(!correct);
        if (ran == CUBLAS_STATUS_SUCCESS) CHECK(wrong > y.size() / 2);  // wrong throughout, not at an edge
        if (ran != CUBLAS_STATUS_SUCCESS) CHECK(ran == CUBLAS_STATUS_INVALID_VALUE);  // a shape conflict
      }
      cublasLtMatmulPreferenceDestroy(pref);
      for (cublasLtMatrixLayout_t l : {lw, lx, ly}) cublasLtMatrixLayoutDestroy(l);
      cublasLtMatmulDescDestroy(desc);
      cublasLtDestroy(handle);
    }
  }
}
