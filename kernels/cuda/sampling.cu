// Sampling on the GPU (kernels/backend.hpp, sample_greedy): the greedy pick of each row and what
// its logprob needs, so that a step of greedy sequences brings back 24 bytes a row instead of the
// row's fp32 logits (500 KiB at a 128k vocabulary).
//
// Exactly the host sampler's results (server/sampling.cpp), by construction rather than by
// tolerance: the argmax is an integer max over sample_key() (the host's order, ties to the lowest
// id), and the softmax denominator an ExpSum (kernels/sampling_ops.hpp), whose fixed-point sum
// does not depend on the order of the additions. The one function whose bits may differ is exp()
// in double: the emulator runs the host's; CUDA's is within 1 ulp of it (the CUDA C Programming
// Guide's table), which reaches the fp32 logprob only when the double lands on a rounding boundary.
//
// Launch: one 512-thread CTA per row, two passes over the row (the max, then the sum of
// exp(l - max)); the second pass mostly hits L2 (a batch of 64 rows at 128k is 32 MiB).
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"
#include "kernels/sampling_ops.hpp"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarpSize;

FP8SERVE_DEVICE unsigned long long warp_max_u64(unsigned long long v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const unsigned long long other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

FP8SERVE_DEVICE ExpSum warp_merge(ExpSum s) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    ExpSum other;
    other.hi = __shfl_xor_sync(kFullMask, static_cast<unsigned long long>(s.hi), offset);
    other.lo = __shfl_xor_sync(kFullMask, static_cast<unsigned long long>(s.lo), offset);
    s.merge(other);
  }
  return s;
}

__global__ void __launch_bounds__(kThreads) sample_greedy_kernel(const float* logits, int64_t vocab, GreedyRow* out) {
  using Partials = unsigned long long[kWarps];
  FP8SERVE_SHARED(Partials, keys);
  FP8SERVE_SHARED(Partials, sums_hi);
  FP8SERVE_SHARED(Partials, sums_lo);
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;

  // Pass 1: the best key. Key 0 is below every element's (an id's low half is never all ones
  // for the ids a row has), so it serves as the identity.
  unsigned long long best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const unsigned long long key = sample_key(row[i], static_cast<int32_t>(i));
    best = key > best ? key : best;
  }
  best = warp_max_u64(best);
  if (lane == 0) keys[warp] = best;
  __syncthreads();
  best = warp_max_u64(lane < kWarps ? keys[lane] : 0ull);
  const int32_t token = sample_key_id(best);
  const float max_logit = row[token];

  // Pass 2: sum of exp(l - max), exact in fixed point (any order gives the same bits).
  ExpSum sum;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum.add(softmax_term(row[i], max_logit));
  sum = warp_merge(sum);
  if (lane == 0) {
    sums_hi[warp] = sum.hi;
    sums_lo[warp] = sum.lo;
  }
  __syncthreads();
  if (warp == 0) {
    ExpSum total;
    if (lane < kWarps) {
      total.hi = sums_hi[lane];
      total.lo = sums_lo[lane];
    }
    total = warp_merge(total);
    if (lane == 0) {
      GreedyRow r;
      r.token = token;
      r.max_logit = max_logit;
      r.sum = total;
      out[blockIdx.x] = r;
    }
  }
}

}  // namespace

void sample_greedy_cuda(const GreedySampleParams& p, cudaStream_t stream) {
  if (p.num_rows < 0 || p.vocab_size < 1 || p.vocab_size > INT32_MAX || p.num_rows > INT32_MAX)
    throw std::invalid_argument("sample_greedy (cuda): bad shape");
  if (p.num_rows == 0) return;
  FP8SERVE_LAUNCH(sample_greedy_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kThreads), 0, stream, p.logits,
                  p.vocab_size, p.out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
