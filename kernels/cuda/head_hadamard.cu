// The Walsh-Hadamard transform of each head on the GPU (--kv-rotation hadamard;
// HeadHadamardParams, forward_ops.hpp): bf16 in and out, the host reference's fp32 arithmetic
// (kernels/cpu/ops_hadamard.cpp) in the same order - butterfly stages len = 1, 2, .., n / 2,
// each a separately rounded add and subtract, then one product with hadamard_scale(n) - so the
// bf16 output is the host's fp32 result rounded once.
//
// Launch: 128 threads a block; x over tokens, y over groups of heads that fill kMaxElements
// fp32 of shared memory (8 KiB: 16 heads of 128, 32 of 64). The group is loaded, transformed
// stage by stage with a barrier between stages, scaled and stored. Fused with RoPE (rope.cu,
// RopeParams::rotate_heads), a group's q and k heads are turned in shared memory first, so q, k
// and v of a layer take one launch instead of two. Memory-bound and tiny: a
// decode step of Llama-3-8B moves 2 x 12 KiB a token through it for q, k and v, and 2 x 8 KiB
// for the output (docs/cuda.md, "Rotation").
#include <stdexcept>
#include <string>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxElements = 2048;

struct HadamardArgs {
  std::uint16_t* x;
  int64_t num_heads;
  int64_t head_dim;
  int64_t token_stride;
  int64_t heads_per_block;
  float scale_2;  // hadamard_scale(2)
  HadamardRope rope;  // rope.heads == 0: the transform alone
};

// hadamard_scale(2^l) exactly: 2^-(l/2), times hadamard_scale(2) for an odd l (a product with a
// power of two is exact), without indexing a table in local memory.
FP8SERVE_DEVICE float scale_of(int log2n, float scale_2) {
  float s = (log2n & 1) ? scale_2 : 1.0f;
  for (int i = 0; i < log2n / 2; ++i) s *= 0.5f;
  return s;
}

// The power-of-two segment of a head that holds element p: its first element and log2 of its
// size (forward_ops.hpp: largest first).
FP8SERVE_DEVICE void segment_of(int64_t p, int64_t head_dim, int64_t& begin, int& log2n) {
  begin = 0;
  for (;;) {
    int l = 0;
    while ((int64_t{2} << l) <= head_dim - begin) ++l;
    if (p < begin + (int64_t{1} << l)) {
      log2n = l;
      return;
    }
    begin += int64_t{1} << l;
  }
}

__global__ void __launch_bounds__(kThreads) head_hadamard_kernel(const HadamardArgs a) {
  FP8SERVE_SHARED(float[kMaxElements], buf);
  const int64_t first_head = static_cast<int64_t>(blockIdx.y) * a.heads_per_block;
  const int64_t heads = a.num_heads - first_head < a.heads_per_block ? a.num_heads - first_head : a.heads_per_block;
  const int64_t n = heads * a.head_dim;
  std::uint16_t* x = a.x + static_cast<int64_t>(blockIdx.x) * a.token_stride + first_head * a.head_dim;
  int top = 0;  // stages of the largest segment
  while ((int64_t{2} << top) <= a.head_dim) ++top;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) buf[e] = bf16_decode(x[e]);
  __syncthreads();
  if (first_head < a.rope.heads) {  // RoPE first, rounded to bf16 as rope_cuda would store it
    const int32_t pos = a.rope.positions[blockIdx.x];
    if (pos < 0 || pos >= a.rope.table.max_positions) {  // the block as a whole: never read outside the table
      if (threadIdx.x == 0) raise_error(a.rope.errors, kErrorPosition);
      return;
    }
    const int64_t half = a.rope.table.half_dim;
    const float* cos_row = a.rope.table.cos + pos * half;
    const float* sin_row = a.rope.table.sin + pos * half;
    const int64_t roped = a.rope.heads - first_head < heads ? a.rope.heads - first_head : heads;
    for (int64_t e = threadIdx.x; e < roped * half; e += blockDim.x) {
      const int64_t i = e % half;
      float* head = buf + (e / half) * a.head_dim;
      float r0, r1;
      rope_pair(head[i], head[i + half], cos_row[i], sin_row[i], r0, r1);
      head[i] = bf16_decode(bf16_encode(r0));
      head[i + half] = bf16_decode(bf16_encode(r1));
    }
    __syncthreads();
  }
  for (int stage = 0; stage < top; ++stage) {
    const int64_t len = int64_t{1} << stage;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
      int64_t begin;
      int log2n;
      segment_of(e % a.head_dim, a.head_dim, begin, log2n);
      const int64_t j = e % a.head_dim - begin;
      if (stage < log2n && (j & len) == 0) {
        const float lo = buf[e];
        const float hi = buf[e + len];
        buf[e] = add_rn(lo, hi);
        buf[e + len] = sub_rn(lo, hi);
      }
    }
    __syncthreads();
  }
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    int64_t begin;
    int log2n;
    segment_of(e % a.head_dim, a.head_dim, begin, log2n);
    x[e] = bf16_encode(mul_rn(buf[e], scale_of(log2n, a.scale_2)));
  }
}

}  // namespace

void head_hadamard_cuda(const HeadHadamardParams& p, cudaStream_t stream, const HadamardRope* rope) {
  if (p.num_tokens < 0 || p.num_heads < 0 || p.head_dim < 1 || p.head_dim > kMaxElements) {
    throw std::invalid_argument("head_hadamard (cuda): bad shape (head_dim 1.." + std::to_string(kMaxElements) + ")");
  }
  if (p.num_tokens == 0 || p.num_heads == 0) return;
  HadamardArgs a{};
  a.x = static_cast<std::uint16_t*>(p.x);
  a.num_heads = p.num_heads;
  a.head_dim = p.head_dim;
  a.token_stride = p.token_stride ? p.token_stride : p.num_heads * p.head_dim;
  a.heads_per_block = kMaxElements / p.head_dim;
  a.scale_2 = hadamard_scale(2);
  if (rope) a.rope = *rope;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(div_up(p.num_heads, a.heads_per_block)));
  FP8SERVE_LAUNCH(head_hadamard_kernel, grid, dim3(kThreads), 0, stream, a);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
