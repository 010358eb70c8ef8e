// The FP8 GEMM's operands (linear_cublaslt.cpp's FP8 path, for steps of more than 16 tokens):
//   - the activations: bf16 x -> E4M3 codes with fp32 scales, per token (B's OUTER_VEC_32F) or
//     per token and 128-input block (B's VEC128_32F), in one kernel: each block reads its row (or
//     row block) once into shared memory, reduces its amax, scale = max(amax / 448, FLT_MIN) -
//     the weights' rule (kernels/fp8_quantize.hpp) - and writes codes = satfinite(RNE(x / scale))
//     from shared memory;
//   - the weights' 128-block scales in VEC128_32F's layout: ours are [out][k_blocks] (a row's
//     blocks together), cuBLASLt reads [k_blocks][pad4(out)] (a block's rows together).
#include <cfloat>
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kQuantThreads = 256;
constexpr int kMaxRow = 16384;  // elements one block stages (32 KiB of bf16)

// blockIdx.x: token; blockIdx.y: the 128-input block (kBlocked) or 0. Codes [t][codes_stride].
template <bool kBlocked>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_quantize_act_kernel(const std::uint16_t* x, int64_t x_stride, int64_t k, std::uint8_t* codes, int64_t codes_stride, float* scales, int64_t scales_stride) {
  FP8SERVE_SHARED(std::uint16_t[kMaxRow], row);
  FP8SERVE_SHARED(float[32], scratch);
  const int64_t t = blockIdx.x;
  const int64_t k0 = kBlocked ? static_cast<int64_t>(blockIdx.y) * 128 : 0;
  const int n = static_cast<int>(kBlocked ? (k - k0 < 128 ? k - k0 : 128) : k);
  const std::uint16_t* src = x + t * x_stride + k0;
  float amax = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kQuantThreads) {
    row[i] = src[i];
    amax = fmaxf(amax, fabsf(bf16_decode(row[i])));
  }
  amax = block_reduce(amax, MaxOp{}, 0.0f, scratch);  // its barriers publish row[]
  const float scale = fmaxf(amax / kFp8E4m3Max, FLT_MIN);
  std::uint8_t* dst = codes + t * codes_stride + k0;
  for (int i = 2 * static_cast<int>(threadIdx.x); i < n; i += 2 * kQuantThreads) {
    const float lo = bf16_decode(row[i]) / scale;
    const float hi = i + 1 < n ? bf16_decode(row[i + 1]) / scale : 0.0f;
    const std::uint16_t pair = ptx::cvt_e4m3x2_f32(lo, hi);
    dst[i] = static_cast<std::uint8_t>(pair & 0xff);
    if (i + 1 < n) dst[i + 1] = static_cast<std::uint8_t>(pair >> 8);
  }
  if (threadIdx.x == 0) scales[kBlocked ? blockIdx.y * scales_stride + t : t] = scale;
}

// out[kb * out_stride + o] = in[o * k_blocks + kb].
__global__ void __launch_bounds__(kQuantThreads)
    fp8_scales_by_block_kernel(const float* in, int64_t rows, int64_t k_blocks, float* out, int64_t out_stride) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x;
  if (i >= rows * k_blocks) return;
  const int64_t kb = i / rows, o = i % rows;
  out[kb * out_stride + o] = in[o * k_blocks + kb];
}

}  // namespace

void fp8_quantize_act_cuda(const std::uint16_t* x, int64_t x_stride, int64_t num_tokens, int64_t k, bool per_block,
                           std::uint8_t* codes, int64_t codes_stride, float* scales, int64_t scales_stride,
                           cudaStream_t stream) {
  if (num_tokens <= 0) return;
  if (num_tokens > 0x7fffffff || (!per_block && k > kMaxRow))
    throw std::invalid_argument("fp8_quantize_act: rows longer than 16384 inputs need per-block scales");
  const dim3 grid(static_cast<unsigned>(num_tokens), per_block ? static_cast<unsigned>(div_up(k, 128)) : 1u);
  if (per_block) {
    FP8SERVE_LAUNCH((fp8_quantize_act_kernel<true>), grid, dim3(kQuantThreads), 0, stream, x, x_stride, k, codes,
                    codes_stride, scales, scales_stride);
  } else {
    FP8SERVE_LAUNCH((fp8_quantize_act_kernel<false>), grid, dim3(kQuantThreads), 0, stream, x, x_stride, k, codes,
                    codes_stride, scales, scales_stride);
  }
  CUDA_CHECK(cudaGetLastError());
}

void fp8_scales_by_block_cuda(const float* scales, int64_t rows, int64_t k_blocks, float* out, int64_t out_stride,
                              cudaStream_t stream) {
  const int64_t total = rows * k_blocks;
  if (total == 0) return;
  FP8SERVE_LAUNCH(fp8_scales_by_block_kernel, dim3(static_cast<unsigned>(div_up(total, kQuantThreads))),
                  dim3(kQuantThreads), 0, stream, scales, rows, k_blocks, out, out_stride);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
