#pragma once
// One cublasLtMatmul for the cuBLASLt stand-in's tests: random operands of the given types and
// shapes in device memory, the descriptors, preference and workspace built through the cuBLASLt
// API, and a host reference in double precision that decodes every element with the project's
// own codecs (kernels/bf16.hpp, kernels/fp8.hpp; fp16 and E5M2 by their bit layout here) - never
// NVIDIA's conversions, which the stand-in uses - and reads the scale tensors by the layouts
// cublaslt_checks.cpp documents. A test changes what it needs between the steps.
#include <cublasLt.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "tests/cuda_emu/cublaslt.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/fp8.hpp"

namespace fp8serve::test {

constexpr int32_t kScalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
constexpr int32_t kOuter = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
constexpr int32_t kVec128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
constexpr int32_t kBlk128 = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;

// What the case computes. Leading dimensions are the stored rows plus a pad.
struct Gemm {
  int64_t m = 8, n = 4, k = 16;
  cudaDataType_t a_type = CUDA_R_16BF, b_type = CUDA_R_16BF, c_type = CUDA_R_16BF, d_type = CUDA_R_16BF;
  bool transa = true, transb = false;
  int64_t lda_pad = 0, ldb_pad = 0, ldc_pad = 0, ldd_pad = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool separate_c = false;  // C out of place (else C is D)
  bool bias = false;
  int32_t a_mode = kScalar, b_mode = kScalar;
  bool a_scale = false, b_scale = false, c_scale = false, d_scale = false, amax = false;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

inline size_t type_size(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : (t == CUDA_R_16BF || t == CUDA_R_16F) ? 2 : 1;
}

// fp16 and E5M2 by their bit layout (E5M2 is fp16's top byte).
inline double decode_half_bits(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 31, mantissa = h & 1023;
  const double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                           : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                            : std::ldexp(1024 + mantissa, exponent - 25);
  return sign ? -magnitude : magnitude;
}

inline double decode(cudaDataType_t t, const std::vector<uint8_t>& bytes, size_t index) {
  switch (t) {
    case CUDA_R_32F: {
      float v;
      std::memcpy(&v, bytes.data() + 4 * index, 4);
      return v;
    }
    case CUDA_R_16BF:
    case CUDA_R_16F: {
      uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * index, 2);
      return t == CUDA_R_16BF ? bf16_decode(v) : decode_half_bits(v);
    }
    case CUDA_R_8F_E4M3: return fp8_e4m3_decode(bytes[index]);
    default: return decode_half_bits(static_cast<uint16_t>(bytes[index] << 8));  // E5M2
  }
}

// n random elements of type t, about N(0, 1), in their bytes.
inline std::vector<uint8_t> random_elements(cudaDataType_t t, size_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> out(n * type_size(t));
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (t == CUDA_R_32F) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else if (t == CUDA_R_16BF) {
      const uint16_t b = bf16_encode(v);
      std::memcpy(out.data() + 2 * i, &b, 2);
    } else if (t == CUDA_R_16F) {  // a random normal fp16: sign, exponent 12..17, mantissa
      const uint16_t h = static_cast<uint16_t>((rng() & 0x8000) | ((12 + rng() % 6) << 10) | (rng() & 1023));
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else if (t == CUDA_R_8F_E4M3) {
      out[i] = fp8_e4m3_encode(v * 8.0f);
    } else {  // E5M2: sign, exponent 11..18, mantissa
      out[i] = static_cast<uint8_t>((rng() & 0x80) | ((11 + rng() % 8) << 2) | (rng() & 3));
    }
  }
  return out;
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, DeviceFree>;

inline DevicePtr upload(const void* host, size_t bytes) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<size_t>(bytes, 1)) == cudaSuccess);
  if (host != nullptr && bytes > 0) REQUIRE(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  return DevicePtr(p);
}

inline std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  REQUIRE(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  REQUIRE(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof value) == CUBLAS_STATUS_SUCCESS);
}

template <class T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
  REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof value) == CUBLAS_STATUS_SUCCESS);
}

inline uint64_t pad4(uint64_t v) { return (v + 3) / 4 * 4; }

class LtCase {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{4} << 20;

  explicit LtCase(const Gemm& g, uint32_t seed = 1) : g_(g), rng_(seed) {
    REQUIRE(cublasLtCreate(&handle_) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc_, g.compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(g.transa ? CUBLAS_OP_T : CUBLAS_OP_N));
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(g.transb ? CUBLAS_OP_T : CUBLAS_OP_N));
    a_rows_ = g.transa ? g.k : g.m;
    b_rows_ = g.transb ? g.n : g.k;
    lda_ = a_rows_ + g.lda_pad;
    ldb_ = b_rows_ + g.ldb_pad;
    ldd_ = g.m + g.ldd_pad;
    ldc_ = g.separate_c ? g.m + g.ldc_pad : ldd_;
    make_layout(a_layout_, g.a_type, a_rows_, g.transa ? g.m : g.k, lda_);
    make_layout(b_layout_, g.b_type, b_rows_, g.transb ? g.k : g.n, ldb_);
    make_layout(c_layout_, g.c_type, g.m, g.n, ldc_);
    make_layout(d_layout_, g.d_type, g.m, g.n, ldd_);
    host_a_ = random_elements(g.a_type, static_cast<size_t>(lda_ * (g.transa ? g.m : g.k)), rng_);
    host_b_ = random_elements(g.b_type, static_cast<size_t>(ldb_ * (g.transb ? g.k : g.n)), rng_);
    host_c_ = random_elements(g.c_type, static_cast<size_t>(ldc_ * g.n), rng_);
    // D starts as a 0x5a pattern (C when in place): the padding rows must keep it.
    host_d_.assign(static_cast<size_t>(ldd_ * g.n) * type_size(g.d_type), 0x5a);
    if (!g.separate_c && g.beta != 0.0f) host_d_ = host_c_;
    a_ = upload(host_a_.data(), host_a_.size());
    b_ = upload(host_b_.data(), host_b_.size());
    d_ = upload(host_d_.data(), host_d_.size());
    if (g.separate_c) c_ = upload(host_c_.data(), host_c_.size());
    if (g.bias) {
      host_bias_ = random_elements(bias_type(), static_cast<size_t>(g.m), rng_);
      bias_ = upload(host_bias_.data(), host_bias_.size());
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(CUBLASLT_EPILOGUE_BIAS));
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias_.get()));
    }
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, g.a_mode);
    set_attribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, g.b_mode);
    if (g.a_scale) scale_a_ = make_scales(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.a_mode, g.m, host_scale_a_);
    if (g.b_scale) scale_b_ = make_scales(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.b_mode, g.n, host_scale_b_);
    if (g.c_scale) scale_c_ = make_scales(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, kScalar, 1, host_scale_c_);
    if (g.d_scale) scale_d_ = make_scales(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, kScalar, 1, host_scale_d_);
    if (g.amax) {
      const float minus_one = -1.0f;
      amax_ = upload(&minus_one, sizeof minus_one);
      set_attribute(desc_, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax_.get());
    }
    workspace_ = upload(nullptr, kWorkspaceBytes);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref_) == CUBLAS_STATUS_SUCCESS);
    set_preference(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
  }

  ~LtCase() {
    cublasLtMatmulPreferenceDestroy(pref_);
    for (cublasLtMatrixLayout_t l : {a_layout_, b_layout_, c_layout_, d_layout_}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc_);
    cublasLtDestroy(handle_);
  }
  LtCase(const LtCase&) = delete;
  LtCase& operator=(const LtCase&) = delete;

  cublasStatus_t heuristic() {
    cublasLtMatmulHeuristicResult_t result{};
    int returned = -1;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_layout_, b_layout_, c_layout_,
                                                            d_layout_, pref_, 1, &result, &returned);
    if (s == CUBLAS_STATUS_SUCCESS) {
      REQUIRE(returned == 1);
      algo = result.algo;
      algo_workspace = result.workspaceSize;
    } else {
      CHECK(returned == 0);
    }
    return s;
  }

  // cublasLtMatmul with this case's pointers (overridable through the public members below).
  cublasStatus_t matmul(cudaStream_t stream = nullptr) {
    return cublasLtMatmul(handle_, desc_, &g_.alpha, a_ptr(), a_layout_, b_ptr(), b_layout_, &g_.beta, c_ptr(),
                          c_layout_, d_ptr(), d_layout_, algo_ptr, workspace_ptr(), workspace_bytes, stream);
  }

  // Downloads D and checks every element against the double-precision reference (padding rows
  // untouched); returns the worst error over its bound.
  double check_result() {
    const std::vector<uint8_t> got = download(d_.get(), host_d_.size());
    const double u = 0x1p-24;
    const double round = g_.d_type == CUDA_R_32F   ? 0.0
                         : g_.d_type == CUDA_R_16BF ? 0x1p-8
                         : g_.d_type == CUDA_R_16F  ? 0x1p-11
                         : g_.d_type == CUDA_R_8F_E4M3 ? 0x1p-4
                                                        : 0x1p-3;
    const double fp8_max = g_.d_type == CUDA_R_8F_E4M3 ? 448.0 : 57344.0;
    const double sd = g_.d_scale ? host_scale_d_[0] : 1.0, sc = g_.c_scale ? host_scale_c_[0] : 1.0;
    double amax = 0.0, worst = 0.0;
    size_t misses = 0;
    for (int64_t j = 0; j < g_.n; ++j) {
      for (int64_t i = 0; i < ldd_; ++i) {
        const size_t at = static_cast<size_t>(i + j * ldd_);
        const size_t width = type_size(g_.d_type);
        if (i >= g_.m) {
          misses += std::memcmp(got.data() + at * width, host_d_.data() + at * width, width) != 0;
          continue;
        }
        double acc = 0.0, magnitude = 0.0;
        for (int64_t l = 0; l < g_.k; ++l) {
          const double prod = decode(g_.a_type, host_a_, a_index(i, l)) * decode(g_.b_type, host_b_, b_index(l, j)) *
                              scale(host_scale_a_, g_.a_mode, g_.m, i, l) * scale(host_scale_b_, g_.b_mode, g_.n, j, l);
          acc += prod;
          magnitude += std::fabs(prod);
        }
        double value = g_.alpha * acc;
        magnitude *= std::fabs(g_.alpha);
        if (g_.beta != 0.0f) {
          const double c = decode(g_.c_type, host_c_, static_cast<size_t>(i + j * ldc_)) * sc * g_.beta;
          value += c;
          magnitude += std::fabs(c);
        }
        if (g_.bias) {
          const double b = decode(bias_type(), host_bias_, static_cast<size_t>(i));
          value += b;
          magnitude += std::fabs(b);
        }
        amax = std::max(amax, std::fabs(value));
        double expected = sd * value;
        if (g_.d_type == CUDA_R_8F_E4M3 || g_.d_type == CUDA_R_8F_E5M2)
          expected = std::clamp(expected, -fp8_max, fp8_max);
        const double bound = round * std::fabs(expected) + std::fabs(sd) * (g_.k + 8) * u * magnitude + 1e-30;
        const double error = std::fabs(decode(g_.d_type, got, at) - expected);
        worst = std::max(worst, error / bound);
        if (!(error <= bound) && ++misses <= 5)
          UNSCOPED_INFO("D[" << i << ", " << j << "] = " << decode(g_.d_type, got, at) << ", expected " << expected
                             << " +- " << bound);
      }
    }
    CHECK(misses == 0);
    if (g_.amax) {
      float got_amax;
      std::memcpy(&got_amax, download(amax_.get(), 4).data(), 4);
      CHECK(std::fabs(got_amax - amax) <= 1e-5 * amax + 1e-30);
    }
    return worst;
  }

  size_t a_index(int64_t i, int64_t l) const { return static_cast<size_t>(g_.transa ? l + i * lda_ : i + l * lda_); }
  size_t b_index(int64_t l, int64_t j) const { return static_cast<size_t>(g_.transb ? j + l * ldb_ : l + j * ldb_); }

  cudaDataType_t bias_type() const {
    const bool fp8 = g_.a_type == CUDA_R_8F_E4M3 || g_.a_type == CUDA_R_8F_E5M2;
    return fp8 && g_.c_type == CUDA_R_32F ? CUDA_R_16BF : g_.c_type;
  }

  const void* a_ptr() const { return a_override ? a_override : a_.get(); }
  const void* b_ptr() const { return b_.get(); }
  const void* c_ptr() const { return g_.separate_c ? c_.get() : d_.get(); }
  void* d_ptr() const { return d_.get(); }
  void* workspace_ptr() const { return workspace_override ? workspace_override : workspace_.get(); }

  const Gemm& gemm() const { return g_; }
  cublasLtHandle_t handle() const { return handle_; }
  cublasLtMatmulDesc_t desc() const { return desc_; }
  cublasLtMatmulPreference_t pref() const { return pref_; }
  cublasLtMatrixLayout_t layout(int role) const {
    return role == 0 ? a_layout_ : role == 1 ? b_layout_ : role == 2 ? c_layout_ : d_layout_;
  }
  std::vector<uint8_t>& host_b() { return host_b_; }
  int64_t ldd() const { return ldd_; }

  // Set by heuristic(); a test may change them.
  cublasLtMatmulAlgo_t algo{};
  const cublasLtMatmulAlgo_t* algo_ptr = &algo;
  size_t algo_workspace = 0;
  size_t workspace_bytes = kWorkspaceBytes;
  const void* a_override = nullptr;
  void* workspace_override = nullptr;

 private:
  void make_layout(cublasLtMatrixLayout_t& layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    REQUIRE(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld) ==
            CUBLAS_STATUS_SUCCESS);
  }

  // Random scales in [0.5, 2) laid out for `mode`, uploaded and set on the descriptor.
  DevicePtr make_scales(cublasLtMatmulDescAttributes_t attribute, int32_t mode, int64_t outer, std::vector<float>& host) {
    const uint64_t k_blocks = (static_cast<uint64_t>(g_.k) + 127) / 128, rows = static_cast<uint64_t>(outer);
    const uint64_t count = mode == kOuter    ? rows
                           : mode == kVec128 ? k_blocks * pad4(rows)
                           : mode == kBlk128 ? (rows + 127) / 128 * pad4(k_blocks)
                                             : 1;
    std::uniform_real_distribution<float> dist(0.5f, 2.0f);
    host.resize(count);
    for (float& v : host) v = dist(rng_);
    DevicePtr device = upload(host.data(), host.size() * sizeof(float));
    set_attribute(desc_, attribute, static_cast<const void*>(device.get()));
    return device;
  }

  // The scale of op(X)'s row `outer` at depth l, read by the documented layouts.
  double scale(const std::vector<float>& s, int32_t mode, int64_t rows, int64_t outer, int64_t l) const {
    if (s.empty()) return 1.0;
    const uint64_t kb = static_cast<uint64_t>(l) / 128, k_blocks = (static_cast<uint64_t>(g_.k) + 127) / 128;
    switch (mode) {
      case kOuter: return s[static_cast<size_t>(outer)];
      case kVec128: return s[kb * pad4(static_cast<uint64_t>(rows)) + static_cast<uint64_t>(outer)];
      case kBlk128: return s[static_cast<uint64_t>(outer) / 128 * pad4(k_blocks) + kb];
      default: return s[0];
    }
  }

  Gemm g_;
  std::mt19937 rng_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr, d_layout_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  int64_t a_rows_ = 0, b_rows_ = 0, lda_ = 0, ldb_ = 0, ldc_ = 0, ldd_ = 0;
  std::vector<uint8_t> host_a_, host_b_, host_c_, host_d_, host_bias_;
  std::vector<float> host_scale_a_, host_scale_b_, host_scale_c_, host_scale_d_;
  DevicePtr a_, b_, c_, d_, bias_, scale_a_, scale_b_, scale_c_, scale_d_, amax_, workspace_;
};

}  // namespace fp8serve::test
