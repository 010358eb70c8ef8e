// RMSNorm on the GPU, plain or fused with the residual add (RmsNormParams, forward_ops.hpp):
// bf16 rows, fp32 arithmetic in the order of the host reference (kernels/cpu/ops_norm.cpp):
// mean = sum(x^2) / dim, inv = 1 / sqrt(mean + eps), out = w * (x * inv), each step rounded
// once. Only the order of the sum of squares differs (a fixed xor tree here, 16 lanes there).
//
// Launch. A team of threads holds one row in registers (at most kMaxIters vectors a thread),
// so x and the residual are read once and written once:
//   rows of at most 32 * kMaxIters vectors (Qwen3's q/k heads, small hidden sizes): a team is a
//     power-of-two group of lanes of a warp (one vector a lane where the row allows), 256
//     threads a block, reduced with xor shuffles inside the group;
//   longer rows (hidden sizes 1024-32768): a team is a whole block of up to 1024 threads,
//     one row per block, reduced with shuffles and one exchange through shared memory.
// 16-byte vectors (8 bf16) when pointers and strides allow, else one element a thread step.
#include <stdexcept>
#include <string>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kMaxIters = 4;
constexpr int kSmallRowThreads = 256;
constexpr int kMaxThreads = 1024;

struct NormArgs {
  const std::uint16_t* x;
  const std::uint16_t* weight;
  std::uint16_t* out;
  std::uint16_t* residual;  // nullptr: plain norm
  int64_t num_rows;         // num_tokens * num_heads
  int64_t num_heads;
  int64_t dim;
  int64_t x_stride;
  int64_t out_stride;
  int64_t residual_stride;
  float eps;
  int team;  // threads per row: a power of two <= 32, or blockDim.x (a multiple of 32)
};

FP8SERVE_DEVICE float round_to_bf16(float v) { return bf16_decode(bf16_encode(v)); }

template <int kVec>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(const NormArgs a) {
  FP8SERVE_SHARED(float[kWarpSize], scratch);
  const bool small_rows = a.team <= kWarpSize;
  const int lane = small_rows ? static_cast<int>(threadIdx.x) % a.team : static_cast<int>(threadIdx.x);
  const int64_t row = small_rows ? static_cast<int64_t>(blockIdx.x) * (blockDim.x / a.team) + threadIdx.x / a.team
                                 : static_cast<int64_t>(blockIdx.x);
  // Lanes past the last row keep going with zeros: their group's shuffles need every lane.
  const bool active = row < a.num_rows;
  const int64_t token = row / a.num_heads;
  const int64_t column = (row - token * a.num_heads) * a.dim;
  const int num_vecs = static_cast<int>(a.dim / kVec);

  float v[kMaxIters][kVec];
  float sum_sq = 0.0f;
FP8SERVE_UNROLL
  for (int it = 0; it < kMaxIters; ++it) {
    const int j = lane + it * a.team;
    if (active && j < num_vecs) {
      const int64_t at = column + static_cast<int64_t>(j) * kVec;
      load_bf16<kVec>(a.x + token * a.x_stride + at, v[it]);
      if (a.residual != nullptr) {
        // residual += x, rounded to bf16 as the stream is stored; the norm reads that value.
        std::uint16_t* r = a.residual + token * a.residual_stride + at;
        float stream[kVec];
        load_bf16<kVec>(r, stream);
FP8SERVE_UNROLL
        for (int i = 0; i < kVec; ++i) v[it][i] = round_to_bf16(stream[i] + v[it][i]);
        store_bf16<kVec>(r, v[it]);
      }
FP8SERVE_UNROLL
      for (int i = 0; i < kVec; ++i) sum_sq += v[it][i] * v[it][i];
    }
  }
  sum_sq = small_rows ? warp_reduce(sum_sq, SumOp{}, a.team) : block_reduce(sum_sq, SumOp{}, 0.0f, scratch);
  const float mean = div_rn(sum_sq, static_cast<float>(a.dim));
  const float inv_rms = div_rn(1.0f, sqrtf(mean + a.eps));
FP8SERVE_UNROLL
  for (int it = 0; it < kMaxIters; ++it) {
    const int j = lane + it * a.team;
    if (active && j < num_vecs) {
      const int64_t at = column + static_cast<int64_t>(j) * kVec;
      float w[kVec];
      load_bf16<kVec>(a.weight + at - column, w);
FP8SERVE_UNROLL
      for (int i = 0; i < kVec; ++i) v[it][i] = mul_rn(w[i], mul_rn(v[it][i], inv_rms));
      store_bf16<kVec>(a.out + token * a.out_stride + at, v[it]);
    }
  }
}

int next_pow2(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

template <int kVec>
void launch(NormArgs a, cudaStream_t stream) {
  const int num_vecs = static_cast<int>(a.dim / kVec);
  if (num_vecs > kMaxThreads * kMaxIters) {
    throw std::invalid_argument("rms_norm (cuda): rows longer than " + std::to_string(kMaxThreads * kMaxIters * kVec) +
                                " elements are not supported");
  }
  int threads = kSmallRowThreads;
  int64_t blocks = 0;
  if (num_vecs <= kWarpSize * kMaxIters) {
    a.team = next_pow2(num_vecs < kWarpSize ? num_vecs : kWarpSize);
    blocks = div_up(a.num_rows, threads / a.team);
  } else {
    // Two vectors a thread where the block allows: two 16-byte loads in flight per thread.
    threads = static_cast<int>(div_up(div_up(num_vecs, 2), kWarpSize) * kWarpSize);
    if (threads > kMaxThreads) threads = kMaxThreads;
    a.team = threads;
    blocks = a.num_rows;
  }
  FP8SERVE_LAUNCH((rms_norm_kernel<kVec>), dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads)), 0,
                  stream, a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rms_norm_cuda(const RmsNormParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_heads < 1 || p.dim < 1 || !(p.eps >= 0.0f)) {
    throw std::invalid_argument("rms_norm (cuda): bad shape or eps");
  }
  if (p.num_tokens == 0) return;
  const int64_t row_elems = p.num_heads * p.dim;
  NormArgs a{};
  a.x = static_cast<const std::uint16_t*>(p.x);
  a.weight = p.weight;
  a.out = static_cast<std::uint16_t*>(p.out);
  a.residual = static_cast<std::uint16_t*>(p.residual);
  a.num_rows = p.num_tokens * p.num_heads;
  a.num_heads = p.num_heads;
  a.dim = p.dim;
  a.x_stride = p.x_token_stride ? p.x_token_stride : row_elems;
  a.out_stride = p.out_token_stride ? p.out_token_stride : row_elems;
  a.residual_stride = p.residual_token_stride ? p.residual_token_stride : row_elems;
  a.eps = p.eps;
  const bool vec = vec8_ok(a.x, a.x_stride, a.dim) && vec8_ok(a.out, a.out_stride, a.dim) &&
                   vec8_ok(a.weight, 0, a.dim) && (a.residual == nullptr || vec8_ok(a.residual, a.residual_stride, a.dim));
  if (vec) {
    launch<kVec8>(a, stream);
  } else {
    launch<1>(a, stream);
  }
}

}  // namespace fp8serve::cuda
