// The portable GEMM for FP8 weights: y = x @ W^T (+ bias) with bf16 x, W FP8 E4M3 with fp32
// scales per row or per row and k-block, fp32 accumulation, y bf16 or fp32 (LinearParams,
// forward_ops.hpp), weight-only: codes converted in registers, times their scale, as they are
// staged. bf16 weights run on cuBLASLt (linear_cublaslt.cpp; in the emulator, against its
// stand-in), so this kernel serves FP8 weights alone, on plain CUDA cores - correct at every shape
// and stride, not fast (a tensor-core path for FP8 weights is the next step).
//
// Tiling: a block of 256 threads computes a 64 (tokens) x 64 (outputs) tile of y, walking K in
// steps of 32: each step stages the x and W tiles in shared memory as fp32, k-major, and each
// thread accumulates a 4 x 4 register tile. Batch invariant: y[t, o] sums its products in
// increasing k whatever the number of rows.
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"
#include "kernels/fp8.hpp"
#include "kernels/cuda/linear_checks.hpp"

namespace fp8serve::cuda {

namespace {

constexpr int kTileM = 64;  // tokens
constexpr int kTileN = 64;  // output features
constexpr int kTileK = 32;
constexpr int kThreads = 256;
constexpr int kPad = 1;  // breaks the 4-way bank conflict of the transposed stores

struct GemmArgs {
  const std::uint16_t* x;
  const std::uint8_t* w8;     // FP8 codes, with
  const float* scales;        // [n, k_blocks]
  int64_t k_blocks;
  int64_t block_k;            // inputs per scale (a multiple of 8)
  const std::uint16_t* bias;
  void* y;
  int64_t m;  // tokens
  int64_t n;  // out_features
  int64_t k;  // in_features
  int64_t x_stride;
  int64_t y_stride;
  bool y_fp32;
};

// Stages rows [row0, row0 + 64) x columns [k0, k0 + 32) of x into tile[k][row] as fp32, zeros
// outside [0, rows) x [0, cols). Thread i loads row i / 4, columns (i % 4) * 8 + 0..7.
FP8SERVE_DEVICE void stage_x_tile(const std::uint16_t* src, int64_t stride, int64_t rows, int64_t cols, int64_t row0,
                                  int64_t k0, float (*tile)[kTileM + kPad]) {
  const int r = static_cast<int>(threadIdx.x) / 4;
  const int c = (static_cast<int>(threadIdx.x) % 4) * 8;
  const int64_t row = row0 + r;
  const int64_t col = k0 + c;
FP8SERVE_UNROLL
  for (int e = 0; e < 8; ++e) tile[c + e][r] = row < rows && col + e < cols ? bf16_decode(src[row * stride + col + e]) : 0.0f;
}

// The W tile: codes decoded and multiplied by their row's scale for the block
// that holds them (8 consecutive inputs never straddle a block: block_k is a multiple of 8).
FP8SERVE_DEVICE void stage_fp8_tile(const GemmArgs& a, int64_t row0, int64_t k0, float (*tile)[kTileM + kPad]) {
  const int r = static_cast<int>(threadIdx.x) / 4;
  const int c = (static_cast<int>(threadIdx.x) % 4) * 8;
  const int64_t row = row0 + r;
  const int64_t col = k0 + c;
  float v[8];
  const float scale = row < a.n && col < a.k ? a.scales[row * a.k_blocks + col / a.block_k] : 0.0f;
FP8SERVE_UNROLL
  for (int e = 0; e < 8; ++e) {
    v[e] = row < a.n && col + e < a.k ? fp8_e4m3_decode(a.w8[row * a.k + col + e]) * scale : 0.0f;
  }
FP8SERVE_UNROLL
  for (int e = 0; e < 8; ++e) tile[c + e][r] = v[e];
}

__global__ void __launch_bounds__(kThreads) linear_kernel(const GemmArgs a) {
  FP8SERVE_SHARED(float[kTileK][kTileM + kPad], xs);
  FP8SERVE_SHARED(float[kTileK][kTileN + kPad], ws);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int ty = static_cast<int>(threadIdx.x) / 16;  // rows ty * 4 + 0..3 of the tile
  const int tx = static_cast<int>(threadIdx.x) % 16;  // columns tx * 4 + 0..3
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < a.k; k0 += kTileK) {
    stage_x_tile(a.x, a.x_stride, a.m, a.k, m0, k0, xs);
    stage_fp8_tile(a, n0, k0, ws);
    __syncthreads();
FP8SERVE_UNROLL
    for (int kk = 0; kk < kTileK; ++kk) {
      float xv[4], wv[4];
FP8SERVE_UNROLL
      for (int i = 0; i < 4; ++i) {
        xv[i] = xs[kk][ty * 4 + i];
        wv[i] = ws[kk][tx * 4 + i];
      }
FP8SERVE_UNROLL
      for (int i = 0; i < 4; ++i) {
FP8SERVE_UNROLL
        for (int j = 0; j < 4; ++j) acc[i][j] += xv[i] * wv[j];
      }
    }
    __syncthreads();  // the tiles are overwritten by the next step
  }
FP8SERVE_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty * 4 + i;
    if (row >= a.m) continue;
FP8SERVE_UNROLL
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      if (col >= a.n) continue;
      const float value = a.bias ? acc[i][j] + bf16_decode(a.bias[col]) : acc[i][j];
      if (a.y_fp32) {
        static_cast<float*>(a.y)[row * a.y_stride + col] = value;
      } else {
        static_cast<std::uint16_t*>(a.y)[row * a.y_stride + col] = bf16_encode(value);
      }
    }
  }
}

}  // namespace

void linear_portable_cuda(const LinearParams& p, cudaStream_t stream) {
  check_linear_params(p, "linear (cuda)");
  if (p.weight_dtype != WeightDtype::fp8_e4m3)
    throw std::invalid_argument("linear (cuda, portable GEMM): FP8 weights only; bf16 weights run on cuBLASLt");
  if (p.num_tokens == 0) return;
  GemmArgs a{};
  a.x = static_cast<const std::uint16_t*>(p.x);
  a.w8 = static_cast<const std::uint8_t*>(p.weight);
  a.scales = p.weight_scales;
  a.block_k = p.weight_block_k > 0 ? p.weight_block_k : p.in_features;
  a.k_blocks = weight_num_k_blocks(p.in_features, p.weight_block_k);
  a.bias = p.bias;
  a.y = p.y;
  a.m = p.num_tokens;
  a.n = p.out_features;
  a.k = p.in_features;
  a.x_stride = p.x_stride ? p.x_stride : p.in_features;
  a.y_stride = p.y_stride ? p.y_stride : p.out_features;
  a.y_fp32 = p.y_fp32;
  if (div_up(a.m, kTileM) > 65535) throw std::invalid_argument("linear (cuda): too many tokens for one launch");
  const dim3 grid(static_cast<unsigned>(div_up(a.n, kTileN)), static_cast<unsigned>(div_up(a.m, kTileM)));
  FP8SERVE_LAUNCH(linear_kernel, grid, dim3(kThreads), 0, stream, a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
