// The cuBLASLt stand-in's rules: which configurations cuBLASLt accepts on an H200 (sm_90), as its
// documentation states them, and the algorithm the heuristic hands out. Sources:
//  - cuBLAS documentation, cublasLtMatmul(): the supported-types tables (COMPUTE_32F rows; the
//    FP8 table with its footnote "FP8 DType is not supported when the scaling mode is OUTER_VEC_32F,
//    VEC128_32F or BLK128x128_32F"), the FP8 requirements ("A must be transposed and B
//    non-transposed (TN) on Ada, Hopper and Blackwell GeForce"; compute type CUBLAS_COMPUTE_32F;
//    scale type CUDA_R_32F; pointers and dimensions 16-byte aligned as Tensor Core Usage lists
//    them: k, m * sizeof(C), lda, ldb, ldc * sizeof(C) multiples of 16 bytes), the workspace (256-byte
//    aligned, at least what the algorithm needs) and the return codes: INVALID_VALUE "if parameters
//    are unexpectedly NULL, in conflict or in an impossible configuration", NOT_SUPPORTED "if the
//    current implementation on the selected device doesn't support the configured operation";
//  - cublasLt.h (13.0): the attributes' types and defaults; BIAS: "Bias vector length must match
//    matrix D rows"; CUBLASLT_MATRIX_LAYOUT_LD "greater or equal to ROWS"; TRANSC "only
//    CUBLAS_OP_N"; the scale pointers: "If set for an unsupported matrix data, scale, and compute
//    type combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE";
//  - FP8 needs sm_89 or later; the scale modes on Hopper (sm_90): SCALAR_32F on every FP8 GPU; OUTER_VEC_32F (a vector of m
//    for A, n for B), VEC128_32F (one scale per 128 consecutive k of a row) and BLK128x128_32F were
//    added for Hopper by cuBLAS 12.9 (NVIDIA's cuBLAS 12.9 announcement; the documentation's
//    grouped-GEMM rules list SCALAR_32F, VEC128_32F and BLK128x128_32F for FP8 on 9.0);
//    VEC16_UE4M3 and VEC32_UE8M0 are Blackwell's (10.x, 11.0, 12.x), not sm_90. A and B pair as
//    both SCALAR, both OUTER_VEC, or 1D x 1D, 1D x 2D, 2D x 1D blocks (2D x 2D is not offered -
//    TransformerEngine's blockwise recipe documents the same); C and D scales are SCALAR only.
//    The block layouts are those cuBLASLt reads and TransformerEngine's "GEMM-ready" format
//    writes for it: VEC128 [ceil(k/128), pad4(rows)] (rows of op(X) fastest, padded to 16 bytes),
//    BLK128x128 [ceil(rows/128), pad4(ceil(k/128))].
// Where the documentation is silent the stand-in is the stricter one: D_SCALE needs an FP8 D,
// A_/B_/C_SCALE and AMAX_D need FP8 A and B, and a scalar paired with a vector mode is refused.
// Configurations cuBLASLt supports but the stand-in does not model (batches, other orders,
// COMPUTE_16F / 32I / FAST_*, device pointer modes, epilogues other than DEFAULT and BIAS) give
// NOT_SUPPORTED, never a wrong answer; the failure reason says so.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "tests/cuda_emu/cublaslt_internal.hpp"
#include "tests/cuda_emu/runtime.hpp"

namespace fp8serve::emu::cublaslt {
namespace {

constexpr uint64_t kAlgoMagic = 0x6670387365727665ull;  // "fp8serve"
constexpr uint32_t kTensorCoreAlignment = 16;  // what the emulated algorithms may assume at most
constexpr uint64_t kAlgoWorkspace = uint64_t{1} << 20;  // a split-K algorithm's workspace

bool is_fp8(cudaDataType_t type) { return type == CUDA_R_8F_E4M3 || type == CUDA_R_8F_E5M2; }

std::string str(uint64_t v) { return std::to_string(v); }

const char* role_name(int role) {
  static const char* const names[] = {"A", "B", "C", "D", "bias"};
  return names[role];
}

// The bias type of the row of cublasLtMatmul's supported-types tables that (A, B, C, D) falls in,
// or -1 when no row has them.
int table_bias_type(const cudaDataType_t t[4]) {
  const cudaDataType_t a = t[kA], b = t[kB], c = t[kC], d = t[kD];
  if (is_fp8(a) || is_fp8(b)) {
    if (!is_fp8(a) || !is_fp8(b) || (a == CUDA_R_8F_E5M2 && b == CUDA_R_8F_E5M2)) return -1;
    const bool any_e5m2 = a == CUDA_R_8F_E5M2 || b == CUDA_R_8F_E5M2;
    const bool fp8_d = d == CUDA_R_8F_E4M3 || (d == CUDA_R_8F_E5M2 && any_e5m2);
    if (c == CUDA_R_16BF && (d == CUDA_R_16BF || fp8_d)) return CUDA_R_16BF;
    if (c == CUDA_R_16F && (d == CUDA_R_16F || fp8_d)) return CUDA_R_16F;
    if (c == CUDA_R_32F && d == CUDA_R_32F) return CUDA_R_16BF;
    return -1;
  }
  if (a != b || c != d) return -1;
  if ((a == CUDA_R_16BF || a == CUDA_R_16F) && (c == a || c == CUDA_R_32F)) return c;
  if (a == CUDA_R_32F && c == CUDA_R_32F) return CUDA_R_32F;
  return -1;
}

bool vector_mode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

bool block_mode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

// Whether sm_90 pairs these A and B scale modes.
bool hopper_scale_pair(int32_t a, int32_t b) {
  constexpr int32_t scalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  constexpr int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  if (a == scalar || b == scalar) return a == b;
  if (a == outer || b == outer) return a == b;
  return block_mode(a) && block_mode(b) && !(a == blk && b == blk);
}

uint64_t fnv(std::initializer_list<uint64_t> values) {
  uint64_t h = 1469598103934665603ull;
  for (const uint64_t v : values) h = (h ^ v) * 1099511628211ull;
  return h;
}

// The largest power of two up to `cap` that divides `bytes` (`cap` for 0).
uint32_t power_of_two_below(uint32_t bytes, uint32_t cap) {
  uint32_t p = cap;
  while (p > 1 && bytes % p != 0) p /= 2;
  return p;
}

}  // namespace

size_t element_size(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: return 0;
  }
}

const char* type_name(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    default: return "a type the stand-in does not model";
  }
}

cublasStatus_t check_configuration(const char* who, const MatmulDesc& desc, const Layout* const layouts[4],
                                   Problem& p) {
  const std::string w = std::string(who) + ": ";
  for (int r = kA; r <= kD; ++r) {
    const Layout& l = *layouts[r];
    p.type[r] = static_cast<cudaDataType_t>(l.type);
    p.ld[r] = l.ld;
    if (element_size(p.type[r]) == 0)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + role_name(r) + " has " + type_name(p.type[r]));
    if (l.order != CUBLASLT_ORDER_COL || l.batch_count != 1 || l.plane_offset != 0 || l.batch_mode != 0)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + role_name(r) +
                                                   ": only single column-major matrices are modelled by the stand-in");
    const bool broadcast_c = r == kC && l.ld == 0;  // an out-of-place C may broadcast one column
    if (!broadcast_c && (l.ld < 0 || static_cast<uint64_t>(l.ld) < std::max<uint64_t>(l.rows, 1)))
      return fail(CUBLAS_STATUS_INVALID_VALUE, w + role_name(r) + "'s leading dimension " + std::to_string(l.ld) +
                                                   " is below its " + str(l.rows) + " rows");
  }
  auto trans = [&](int32_t op, const char* name, bool& out) {
    if (op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C) {
      out = op != CUBLAS_OP_N;  // conjugation is nothing for real types
      return CUBLAS_STATUS_SUCCESS;
    }
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + name + " is not a cublasOperation_t");
  };
  if (const cublasStatus_t s = trans(desc.transa, "TRANSA", p.transa); s != CUBLAS_STATUS_SUCCESS) return s;
  if (const cublasStatus_t s = trans(desc.transb, "TRANSB", p.transb); s != CUBLAS_STATUS_SUCCESS) return s;
  if (desc.transc != CUBLAS_OP_N) return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "TRANSC must be CUBLAS_OP_N");

  // Shapes: op(A) [m, k], op(B) [k, n], C and D [m, n].
  const Layout &a = *layouts[kA], &b = *layouts[kB], &c = *layouts[kC], &d = *layouts[kD];
  p.m = p.transa ? a.cols : a.rows;
  p.k = p.transa ? a.rows : a.cols;
  const uint64_t kb = p.transb ? b.cols : b.rows;
  p.n = p.transb ? b.rows : b.cols;
  if (kb != p.k)
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + "op(A) is " + str(p.m) + " x " + str(p.k) + " but op(B) is " + str(kb) +
                                                 " x " + str(p.n));
  if (d.rows != p.m || d.cols != p.n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + "D is " + str(d.rows) + " x " + str(d.cols) + ", op(A) op(B) is " +
                                                 str(p.m) + " x " + str(p.n));
  if (c.rows != d.rows || c.cols != d.cols)
    return fail(CUBLAS_STATUS_INVALID_VALUE, w + "C is " + str(c.rows) + " x " + str(c.cols) + ", D is " + str(d.rows) +
                                                 " x " + str(d.cols));

  // Types.
  if (desc.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "only CUBLASLT_POINTER_MODE_HOST is modelled by the stand-in");
  if (desc.fill_mode != CUBLAS_FILL_MODE_FULL)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "only CUBLAS_FILL_MODE_FULL is modelled by the stand-in");
  p.fp8 = is_fp8(p.type[kA]) || is_fp8(p.type[kB]);
  const int bias_type = table_bias_type(p.type);
  if (bias_type < 0)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "no supported-types row has A " + type_name(p.type[kA]) + ", B " +
                                                 type_name(p.type[kB]) + ", C " + type_name(p.type[kC]) + ", D " +
                                                 type_name(p.type[kD]));
  const bool compute_32f = desc.compute_type == CUBLAS_COMPUTE_32F ||
                           (!p.fp8 && desc.compute_type == CUBLAS_COMPUTE_32F_PEDANTIC);
  if (!compute_32f || desc.scale_type != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                w + "compute type " + std::to_string(desc.compute_type) + " with scale type " +
                    std::to_string(desc.scale_type) +
                    (p.fp8 ? ": FP8 needs CUBLAS_COMPUTE_32F and CUDA_R_32F"
                           : ": the stand-in models CUBLAS_COMPUTE_32F(_PEDANTIC) with CUDA_R_32F"));

  const int sm = detail::emulated_sm();
  if (p.fp8 && sm < 89)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "FP8 matmuls need sm_89 or later; the device is sm_" + std::to_string(sm));
  if (p.fp8) {
    // FP8 on sm_90: TN only, and 16-byte aligned dimensions (the pointers: see choose_algo).
    if (!p.transa || p.transb) return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "FP8 on sm_90 needs TRANSA T and TRANSB N");
    const size_t c_size = element_size(p.type[kC]), d_size = element_size(p.type[kD]);
    if (p.k % 16 != 0 || (p.m * c_size) % 16 != 0 || a.ld % 16 != 0 || b.ld % 16 != 0 ||
        (static_cast<uint64_t>(c.ld) * c_size) % 16 != 0 || (static_cast<uint64_t>(d.ld) * d_size) % 16 != 0)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  w + "FP8 needs k, m * sizeof(C), lda, ldb, ldc * sizeof(C) and ldd * sizeof(D) to be multiples of 16 "
                      "bytes (m " + str(p.m) + ", k " + str(p.k) + ")");
  }

  // Scale modes.
  for (int r = kA; r <= kD; ++r) {
    const int32_t mode = desc.scale_mode[r];
    if (mode < 0 || mode >= CUBLASLT_MATMUL_MATRIX_SCALE_END)
      return fail(CUBLAS_STATUS_INVALID_VALUE, w + role_name(r) + "_SCALE_MODE is not a cublasLtMatmulMatrixScale_t");
    if (mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && (!p.fp8 || r >= kC))
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + role_name(r) + "_SCALE_MODE " + std::to_string(mode) +
                                                   (p.fp8 ? ": C and D scales are SCALAR_32F on sm_90"
                                                          : ": scale modes apply to FP8 A and B only"));
  }
  p.scale_mode[kA] = desc.scale_mode[kA];
  p.scale_mode[kB] = desc.scale_mode[kB];
  if (p.fp8) {
    if (sm != 90 && (vector_mode(p.scale_mode[kA]) || vector_mode(p.scale_mode[kB])))
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "the OUTER_VEC, VEC128 and BLK128x128 scale modes are sm_90's; the "
                                                   "device is sm_" + std::to_string(sm));
    if (!hopper_scale_pair(p.scale_mode[kA], p.scale_mode[kB]))
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "sm_90 has no FP8 kernel for A_SCALE_MODE " +
                                                   std::to_string(p.scale_mode[kA]) + " with B_SCALE_MODE " +
                                                   std::to_string(p.scale_mode[kB]));
    if (vector_mode(p.scale_mode[kA]) && is_fp8(p.type[kD]))
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "an FP8 D is not supported with vector or block scale modes");
  }

  // Epilogue.
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc.epilogue != CUBLASLT_EPILOGUE_BIAS)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, w + "epilogue " + std::to_string(desc.epilogue) +
                                                 ": the stand-in models DEFAULT and BIAS");
  p.bias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (p.bias) {
    if (desc.bias_type != -1 && desc.bias_type != bias_type)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  w + "BIAS_DATA_TYPE " + type_name(static_cast<cudaDataType_t>(desc.bias_type)) + ": this row takes " +
                      type_name(static_cast<cudaDataType_t>(bias_type)) + " bias");
    p.bias_type = static_cast<cudaDataType_t>(bias_type);
  }
  return CUBLAS_STATUS_SUCCESS;
}

uint64_t signature(const Problem& p, const MatmulDesc& desc) {
  return fnv({static_cast<uint64_t>(desc.compute_type), static_cast<uint64_t>(desc.scale_type), p.type[kA], p.type[kB],
              p.type[kC], p.type[kD], p.transa, p.transb, desc.epilogue, p.bias ? uint64_t{p.bias_type} : 0,
              static_cast<uint64_t>(p.scale_mode[kA]), static_cast<uint64_t>(p.scale_mode[kB])});
}

cublasStatus_t choose_algo(const Problem& p, const MatmulDesc& desc, const Preference& pref, Algo& algo) {
  algo = Algo{};
  algo.signature = signature(p, desc);
  for (int r = kA; r <= kD; ++r) {
    const uint32_t at_least = p.fp8 ? kTensorCoreAlignment : static_cast<uint32_t>(element_size(p.type[r]));
    if (pref.min_alignment[r] < at_least)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, std::string("cublasLtMatmulAlgoGetHeuristic: MIN_ALIGNMENT_") +
                                                   role_name(r) + "_BYTES " + std::to_string(pref.min_alignment[r]) +
                                                   ": no algorithm works below " + std::to_string(at_least));
    algo.alignment[r] = power_of_two_below(pref.min_alignment[r], kTensorCoreAlignment);
  }
  if (p.bias) {
    // The heuristic reads the bias pointer's alignment from the descriptor (cublasLt.h).
    const uint32_t aligned = power_of_two_below(static_cast<uint32_t>(reinterpret_cast<uintptr_t>(desc.bias) % 256), 256);
    if (aligned < element_size(p.bias_type))
      return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                  "cublasLtMatmulAlgoGetHeuristic: the bias pointer is not aligned to its element");
    algo.alignment[4] = std::min(aligned, kTensorCoreAlignment);
  }
  algo.workspace = std::min<uint64_t>(pref.max_workspace, kAlgoWorkspace) / 256 * 256;
  return CUBLAS_STATUS_SUCCESS;
}

void encode_algo(const Algo& algo, cublasLtMatmulAlgo_t& out) {
  out = cublasLtMatmulAlgo_t{};
  uint64_t packed = 0;
  for (int i = 0; i < 5; ++i) packed |= uint64_t{algo.alignment[i]} << (12 * i);
  out.data[0] = kAlgoMagic;
  out.data[1] = algo.signature;
  out.data[2] = packed;
  out.data[3] = algo.workspace;
  out.data[4] = fnv({out.data[0], out.data[1], out.data[2], out.data[3]});
}

bool decode_algo(const cublasLtMatmulAlgo_t& in, Algo& algo) {
  if (in.data[0] != kAlgoMagic || in.data[4] != fnv({in.data[0], in.data[1], in.data[2], in.data[3]})) return false;
  algo.signature = in.data[1];
  for (int i = 0; i < 5; ++i) algo.alignment[i] = static_cast<uint32_t>((in.data[2] >> (12 * i)) & 0xfff);
  algo.workspace = in.data[3];
  return true;
}

size_t scale_tensor_bytes(int32_t mode, uint64_t outer, uint64_t k) {
  const uint64_t k_blocks = (k + 127) / 128;
  auto pad4 = [](uint64_t v) { return (v + 3) / 4 * 4; };
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return outer * sizeof(float);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
      return k_blocks == 0 ? 0 : ((k_blocks - 1) * pad4(outer) + outer) * sizeof(float);
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: {
      const uint64_t outer_blocks = (outer + 127) / 128;
      return outer_blocks == 0 ? 0 : ((outer_blocks - 1) * pad4(k_blocks) + k_blocks) * sizeof(float);
    }
    default: return sizeof(float);
  }
}

}  // namespace fp8serve::emu::cublaslt
