// Elementwise ops on the GPU: SiLU·mul (SwiGLU), the residual add, and the bias add for fp32
// outputs. bf16 in and out, fp32 arithmetic in the host reference's order
// (kernels/cpu/ops_activation.cpp): silu(g) = g / (1 + exp(-g)), then one product with up.
//
// Launch: 256 threads, a thread per 16-byte vector (8 bf16) when aligned. SiLU·mul runs a 2-D
// grid - x over the vectors of a row, y over tokens (looping past 65,535) - so a decode step's
// few long rows still spread over every SM.
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 1 << 20;

struct SiluArgs {
  const std::uint16_t* gate;
  const std::uint16_t* up;
  std::uint16_t* out;
  int64_t num_tokens;
  int64_t dim;
  int64_t gate_stride;
  int64_t up_stride;
  int64_t out_stride;
};

template <int kVec>
__global__ void __launch_bounds__(kThreads) silu_mul_kernel(const SiluArgs a) {
  const int64_t num_vecs = a.dim / kVec;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= num_vecs) return;
  for (int64_t t = blockIdx.y; t < a.num_tokens; t += gridDim.y) {
    float g[kVec], u[kVec];
    load_bf16<kVec>(a.gate + t * a.gate_stride + j * kVec, g);
    load_bf16<kVec>(a.up + t * a.up_stride + j * kVec, u);
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) g[i] = mul_rn(div_rn(g[i], add_rn(1.0f, expf(-g[i]))), u[i]);
    store_bf16<kVec>(a.out + t * a.out_stride + j * kVec, g);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) residual_add_kernel(std::uint16_t* residual, const std::uint16_t* x,
                                                                 int64_t num_vecs) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < num_vecs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float r[kVec], d[kVec];
    load_bf16<kVec>(residual + j * kVec, r);
    load_bf16<kVec>(x + j * kVec, d);
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) r[i] += d[i];
    store_bf16<kVec>(residual + j * kVec, r);
  }
}

__global__ void __launch_bounds__(kThreads) add_bias_f32_kernel(float* y, int64_t y_stride, const std::uint16_t* bias,
                                                                 int64_t num_cols) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col < num_cols) y[blockIdx.y * y_stride + col] += bf16_decode(bias[col]);
}

}  // namespace

void silu_mul_cuda(const SiluMulParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.dim < 0) throw std::invalid_argument("silu_mul (cuda): bad shape");
  if (p.num_tokens == 0 || p.dim == 0) return;
  SiluArgs a{};
  a.gate = static_cast<const std::uint16_t*>(p.gate);
  a.up = static_cast<const std::uint16_t*>(p.up);
  a.out = static_cast<std::uint16_t*>(p.out);
  a.num_tokens = p.num_tokens;
  a.dim = p.dim;
  a.gate_stride = p.gate_token_stride ? p.gate_token_stride : p.dim;
  a.up_stride = p.up_token_stride ? p.up_token_stride : p.dim;
  a.out_stride = p.out_token_stride ? p.out_token_stride : p.dim;
  const bool vec = vec8_ok(a.gate, a.gate_stride, a.dim) && vec8_ok(a.up, a.up_stride, a.dim) &&
                   vec8_ok(a.out, a.out_stride, a.dim);
  const int64_t num_vecs = vec ? a.dim / kVec8 : a.dim;
  const dim3 grid(static_cast<unsigned>(div_up(num_vecs, kThreads)),
                  static_cast<unsigned>(a.num_tokens < kMaxGridY ? a.num_tokens : kMaxGridY));
  if (vec) {
    FP8SERVE_LAUNCH((silu_mul_kernel<kVec8>), grid, dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  } else {
    FP8SERVE_LAUNCH((silu_mul_kernel<1>), grid, dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  }
}

void residual_add_cuda(const ResidualAddParams& p, cudaStream_t stream) {
  if (p.num_elements < 0) throw std::invalid_argument("residual_add (cuda): negative size");
  if (p.num_elements == 0) return;
  auto* residual = static_cast<std::uint16_t*>(p.residual);
  const auto* x = static_cast<const std::uint16_t*>(p.x);
  const bool vec = vec8_ok(residual, 0, p.num_elements) && vec8_ok(x, 0, p.num_elements);
  const int64_t num_vecs = vec ? p.num_elements / kVec8 : p.num_elements;
  int64_t blocks = div_up(num_vecs, kThreads);
  if (blocks > kMaxGridX) blocks = kMaxGridX;
  if (vec) {
    FP8SERVE_LAUNCH((residual_add_kernel<kVec8>), dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                    residual, x, num_vecs);
    CUDA_CHECK(cudaGetLastError());
  } else {
    FP8SERVE_LAUNCH((residual_add_kernel<1>), dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                    residual, x, num_vecs);
    CUDA_CHECK(cudaGetLastError());
  }
}

void add_bias_f32_cuda(float* y, int64_t y_stride, const std::uint16_t* bias, int64_t num_rows, int64_t num_cols,
                       cudaStream_t stream) {
  if (num_rows < 1 || num_cols < 1) return;
  if (num_rows > kMaxGridY) throw std::invalid_argument("add_bias_f32 (cuda): more than 65,535 rows");
  const dim3 grid(static_cast<unsigned>(div_up(num_cols, kThreads)), static_cast<unsigned>(num_rows));
  FP8SERVE_LAUNCH(add_bias_f32_kernel, grid, dim3(kThreads), 0, stream, y, y_stride, bias, num_cols);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
