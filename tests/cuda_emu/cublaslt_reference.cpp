// The cuBLASLt stand-in's arithmetic: a plain loop that defines what cublasLtMatmul computes, so
// a test against a host reference checks the caller's descriptors, not a clever kernel.
//   D(i, j) = scale_D * (alpha * sum_kb [ (sum_{l in kb} A(i, l) B(l, j)) * sA(i, kb) * sB(j, kb) ]
//                        + beta * scale_C * C(i, j) + bias(i))
// Products and sums are fp32, in k order; one k block spans all of k unless A or B is block
// scaled (128-deep blocks, each block's partial sum scaled as it is added). sA / sB are 1 (no
// pointer), the scalar, the outer vector's i-th / j-th element, or the block's scale. AMAX_D
// receives max |value before scale_D| (what a delayed-scaling caller derives the next scale_D
// from). C is not read when beta is 0, as in BLAS. Elements are decoded and D is rounded with
// NVIDIA's host conversions from <cuda_bf16.h>, <cuda_fp16.h> and <cuda_fp8.h>: bf16 and fp16 round
// to nearest even, FP8 D saturates to the largest finite value (__NV_SATFINITE).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tests/cuda_emu/cublaslt_internal.hpp"

namespace fp8serve::emu::cublaslt {
namespace {

float load(cudaDataType_t type, const void* base, uint64_t index) {
  const auto* bytes = static_cast<const unsigned char*>(base) + index * element_size(type);
  switch (type) {
    case CUDA_R_32F: {
      float v;
      std::memcpy(&v, bytes, sizeof v);
      return v;
    }
    case CUDA_R_16BF: {
      __nv_bfloat16_raw raw;
      std::memcpy(&raw.x, bytes, sizeof raw.x);
      return __bfloat162float(__nv_bfloat16(raw));
    }
    case CUDA_R_16F: {
      __half_raw raw;
      std::memcpy(&raw.x, bytes, sizeof raw.x);
      return __half2float(__half(raw));
    }
    case CUDA_R_8F_E4M3: {
      __nv_fp8_e4m3 v;
      v.__x = *bytes;
      return static_cast<float>(v);
    }
    case CUDA_R_8F_E5M2: {
      __nv_fp8_e5m2 v;
      v.__x = *bytes;
      return static_cast<float>(v);
    }
    default: return NAN;  // unreachable: check_configuration refused the type
  }
}

void store(cudaDataType_t type, void* base, uint64_t index, float value) {
  auto* bytes = static_cast<unsigned char*>(base) + index * element_size(type);
  switch (type) {
    case CUDA_R_32F: std::memcpy(bytes, &value, sizeof value); break;
    case CUDA_R_16BF: {
      const __nv_bfloat16_raw raw = __float2bfloat16(value);
      std::memcpy(bytes, &raw.x, sizeof raw.x);
      break;
    }
    case CUDA_R_16F: {
      const __half_raw raw = __float2half(value);
      std::memcpy(bytes, &raw.x, sizeof raw.x);
      break;
    }
    case CUDA_R_8F_E4M3: *bytes = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3); break;
    case CUDA_R_8F_E5M2: *bytes = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E5M2); break;
    default: break;
  }
}

// The scale of op(X)'s row `outer` (i of A, j of B) in k block `kb`, per the operand's mode.
class Scale {
 public:
  Scale(int32_t mode, const void* pointer, uint64_t outer_rows, uint64_t k)
      : mode_(mode), values_(static_cast<const float*>(pointer)), outer_pad4_((outer_rows + 3) / 4 * 4),
        k_blocks_pad4_(((k + 127) / 128 + 3) / 4 * 4) {}

  float at(uint64_t outer, uint64_t kb) const {
    if (values_ == nullptr) return 1.0f;
    switch (mode_) {
      case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return read(outer);
      case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return read(kb * outer_pad4_ + outer);
      case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return read(outer / 128 * k_blocks_pad4_ + kb);
      default: return read(0);
    }
  }

 private:
  float read(uint64_t index) const {
    float v;
    std::memcpy(&v, values_ + index, sizeof v);
    return v;
  }

  int32_t mode_;
  const float* values_;
  uint64_t outer_pad4_, k_blocks_pad4_;
};

float scalar_or_one(const void* pointer) {
  if (pointer == nullptr) return 1.0f;
  float v;
  std::memcpy(&v, pointer, sizeof v);
  return v;
}

}  // namespace

void run_reference(const Call& call) {
  const Problem& p = call.problem;
  if (call.workspace_bytes > 0) std::memset(call.workspace, 0xff, call.workspace_bytes);  // clobbered, as a split-K run leaves it
  if (p.m == 0 || p.n == 0) return;
  auto block_scaled = [](int32_t mode) {
    return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  };
  const bool blocked = p.fp8 && (block_scaled(p.scale_mode[kA]) || block_scaled(p.scale_mode[kB]));
  const uint64_t block = blocked ? 128 : std::max<uint64_t>(p.k, 1);
  const Scale scale_a(p.fp8 ? p.scale_mode[kA] : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, call.scale[kA], p.m, p.k);
  const Scale scale_b(p.fp8 ? p.scale_mode[kB] : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, call.scale[kB], p.n, p.k);
  const float scale_c = scalar_or_one(call.scale[kC]), scale_d = scalar_or_one(call.scale[kD]);

  // op(B) decoded once, one column of k values per j: [n, k].
  std::vector<float> b(p.n * p.k);
  for (uint64_t j = 0; j < p.n; ++j)
    for (uint64_t l = 0; l < p.k; ++l)
      b[j * p.k + l] = load(p.type[kB], call.b, p.transb ? j + l * p.ld[kB] : l + j * p.ld[kB]);
  std::vector<float> a_row(p.k);  // op(A)'s row i
  float amax = 0.0f;
  for (uint64_t i = 0; i < p.m; ++i) {
    for (uint64_t l = 0; l < p.k; ++l) a_row[l] = load(p.type[kA], call.a, p.transa ? l + i * p.ld[kA] : i + l * p.ld[kA]);
    for (uint64_t j = 0; j < p.n; ++j) {
      const float* b_col = b.data() + j * p.k;
      float acc = 0.0f;
      for (uint64_t k0 = 0, kb = 0; k0 < p.k; k0 += block, ++kb) {
        float partial = 0.0f;
        for (uint64_t l = k0; l < std::min(p.k, k0 + block); ++l) partial += a_row[l] * b_col[l];
        acc += partial * scale_a.at(i, kb) * scale_b.at(j, kb);
      }
      float value = call.alpha * acc;
      if (call.beta != 0.0f) value += call.beta * scale_c * load(p.type[kC], call.c, i + j * p.ld[kC]);
      if (p.bias) value += load(p.bias_type, call.bias, i);
      amax = std::max(amax, std::fabs(value));
      store(p.type[kD], call.d, i + j * p.ld[kD], scale_d * value);
    }
  }
  if (call.amax_d != nullptr) std::memcpy(call.amax_d, &amax, sizeof amax);
}

}  // namespace fp8serve::emu::cublaslt
