#pragma once
// Inside the cuBLASLt stand-in: what its descriptors hold, the matmul a call describes once
// checked, the algorithm its heuristic hands out, and the reference loop. The entry points are in
// cublaslt.cpp, the checks in cublaslt_checks.cpp, the loop in cublaslt_reference.cpp. Not for
// kernels or tests (they see tests/cuda_emu/cublaslt.hpp).
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8serve::emu::cublaslt {

// Operand roles, as the arrays below index them.
enum Role : int { kA = 0, kB = 1, kC = 2, kD = 3 };

// cublasLtMatrixLayout_t. Defaults as cublasLt.h documents them.
struct Layout {
  uint32_t type = 0;  // cudaDataType
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch_count = 1;
  int64_t batch_stride = 0;
  int64_t plane_offset = 0;
  uint32_t batch_mode = 0;
};

// cublasLtMatmulDesc_t.
struct MatmulDesc {
  int32_t compute_type = 0;  // cublasComputeType_t
  int32_t scale_type = 0;    // cudaDataType
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  int32_t fill_mode = CUBLAS_FILL_MODE_FULL;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_batch_stride = 0;
  int32_t bias_type = -1;  // -1: the type the supported-types table gives
  const void* scale[4] = {};  // A_, B_, C_, D_SCALE_POINTER
  int32_t scale_mode[4] = {CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                           CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F};
  void* amax_d = nullptr;
  int8_t fast_accum = 0;
  int32_t sm_count_target = 0;
};

// cublasLtMatmulPreference_t.
struct Preference {
  uint32_t search_mode = 0;
  uint64_t max_workspace = 0;
  uint32_t reduction_scheme_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  uint32_t min_alignment[4] = {256, 256, 256, 256};  // A, B, C, D
  float max_waves = 0.0f;
  uint64_t impl_mask = ~uint64_t{0};
};

// A matmul whose descriptors passed the checks: D [m, n] = alpha op(A) [m, k] op(B) [k, n]
// + beta C [m, n] (+ bias [m]), every matrix column-major with its leading dimension.
struct Problem {
  uint64_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  cudaDataType_t type[4] = {};
  int64_t ld[4] = {};
  bool fp8 = false;  // A and B are FP8: the scale attributes apply
  bool bias = false;  // the BIAS epilogue
  cudaDataType_t bias_type = CUDA_R_32F;
  int32_t scale_mode[2] = {};  // A's and B's
};

// The algorithm cublasLtMatmulAlgoGetHeuristic chose: what the problem looked like (signature)
// and what the real pointers and workspace of every later call must give it.
struct Algo {
  uint64_t signature = 0;
  uint32_t alignment[5] = {};  // A, B, C, D, bias: the bytes each pointer must be aligned to
  uint64_t workspace = 0;      // bytes of workspace it needs
};

// Records why a call failed (fp8serve::emu::cublaslt_last_failure) and returns `status`.
cublasStatus_t fail(cublasStatus_t status, const std::string& reason);
void clear_failure();

size_t element_size(cudaDataType_t type);  // 0 for a type the stand-in does not know
const char* type_name(cudaDataType_t type);

// The status cuBLASLt gives a configuration before any pointer is looked at (the heuristic and
// cublasLtMatmul share it); fills `problem` on success. `who` names the entry point in the reason.
cublasStatus_t check_configuration(const char* who, const MatmulDesc& desc, const Layout* const layouts[4],
                                   Problem& problem);

// The heuristic's choice for a checked problem under `preference`, or NOT_SUPPORTED when the
// preference excludes every algorithm (alignments too small).
cublasStatus_t choose_algo(const Problem& problem, const MatmulDesc& desc, const Preference& preference, Algo& algo);
uint64_t signature(const Problem& problem, const MatmulDesc& desc);
void encode_algo(const Algo& algo, cublasLtMatmulAlgo_t& out);
bool decode_algo(const cublasLtMatmulAlgo_t& in, Algo& algo);

// Bytes of an A or B scale tensor (SCALAR: one float; OUTER_VEC: one per row of op(X); VEC128 /
// BLK128x128: the span the 1D / 2D block layout reads) for an operand with `outer` rows of op(X)
// (m for A, n for B) and depth k.
size_t scale_tensor_bytes(int32_t mode, uint64_t outer, uint64_t k);

// One cublasLtMatmul call as queued: the checked problem, its device pointers (read only when the
// work runs) and the host scalars (read at the call, as pointer mode HOST does).
struct Call {
  Problem problem;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  const void* scale[4] = {};
  void* amax_d = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // what the algorithm uses: poisoned by every run
};

// The reference loop: fp32 products accumulated in k order (per 128-deep block under block
// scaling), the epilogue, and D written in its type with NVIDIA's host conversions.
void run_reference(const Call& call);

}  // namespace fp8serve::emu::cublaslt
