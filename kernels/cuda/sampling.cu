// Sampling on the GPU (kernels/backend.hpp, sample_greedy): the greedy pick of each row and what
// its logprob needs, so that a step of greedy sequences brings back 24 bytes a row instead of the
// row's fp32 logits (500 KiB at a 128k vocabulary).
//
// Exactly the host sampler's results (server/engine/sampling.cpp), by construction rather than by
// tolerance: the argmax is an integer max over sample_key() (the host's order, ties to the lowest
// id), and the softmax denominator an ExpSum (kernels/sampling_ops.hpp), whose fixed-point sum
// does not depend on the order of the additions. The one function whose bits may differ is exp()
// in double: the emulator runs the host's; CUDA's is within 1 ulp of it (the CUDA C Programming
// Guide's table), which reaches the fp32 logprob only when the double lands on a rounding boundary.
//
// Launch: one 512-thread CTA per row, two passes over the row (the max, then the sum of
// exp(l - max)); the second pass mostly hits L2 (a batch of 64 rows at 128k is 32 MiB). The
// prefilter adds four radix passes and two compaction passes (docs/cuda.md, "Sampling on the GPU").
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

// The row's best sample_key over the block (every thread gets it). Key 0 is below every
// element's (an id's low half is never all ones for the ids a row has): the identity.
// scratch: __shared__ unsigned long long[kWarps].
FP8SERVE_DEVICE unsigned long long block_best_key(const float* row, int64_t vocab, unsigned long long* scratch) {
  unsigned long long best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const unsigned long long key = sample_key(row[i], static_cast<int32_t>(i));
    best = key > best ? key : best;
  }
  best = warp_max_u64(best);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (lane == 0) scratch[threadIdx.x / kWarpSize] = best;
  __syncthreads();
  return warp_max_u64(lane < kWarps ? scratch[lane] : 0ull);
}

// The block's ExpSums merged (exact: any order gives the same bits); the result in thread 0.
// scratch_hi, scratch_lo: __shared__ unsigned long long[kWarps], free again on return.
FP8SERVE_DEVICE ExpSum block_merge(ExpSum s, unsigned long long* scratch_hi, unsigned long long* scratch_lo) {
  s = warp_merge(s);
  if (threadIdx.x % kWarpSize == 0) {
    scratch_hi[threadIdx.x / kWarpSize] = s.hi;
    scratch_lo[threadIdx.x / kWarpSize] = s.lo;
  }
  __syncthreads();
  ExpSum total;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total.merge(ExpSum{scratch_hi[w], scratch_lo[w]});
  __syncthreads();
  return total;
}

// f(logit, id) for this thread's ids (threadIdx.x, + kThreads, ..) in order, with kAhead loads in
// flight before the first is used: a pass waits a round trip per kAhead elements, not per element.
// (sample_greedy's one-term loop keeps its plain form: unrolled, it issues ~6% more, which is what
// binds it.)
constexpr int kAhead = 4;
template <class F>
FP8SERVE_DEVICE void for_each_logit(const float* row, int64_t vocab, F&& f) {
  for (int64_t base = threadIdx.x; base < vocab; base += int64_t{kAhead} * kThreads) {
    float logit[kAhead];
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int64_t i = base + int64_t{u} * kThreads;
      logit[u] = i < vocab ? row[i] : 0.0f;
    }
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int64_t i = base + int64_t{u} * kThreads;
      if (i < vocab) f(logit[u], i);
    }
  }
}

__global__ void __launch_bounds__(kThreads) sample_greedy_kernel(const float* logits, int64_t vocab, GreedyRow* out) {
  using Partials = unsigned long long[kWarps];
  FP8SERVE_SHARED(Partials, keys);
  FP8SERVE_SHARED(Partials, sums_hi);
  FP8SERVE_SHARED(Partials, sums_lo);
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  // Pass 1: the best key; pass 2: the sum of exp(l - max).
  const int32_t token = sample_key_id(block_best_key(row, vocab, keys));
  const float max_logit = row[token];
  ExpSum sum;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) sum.add(softmax_term(row[i], max_logit));
  sum = block_merge(sum, sums_hi, sums_lo);
  if (threadIdx.x == 0) out[blockIdx.x] = GreedyRow{token, max_logit, sum};
}

FP8SERVE_DEVICE uint32_t key_order(float logit, int64_t id) {
  return static_cast<uint32_t>(sample_key(logit, static_cast<int32_t>(id)) >> 32);
}

// The top-K prefilter of one row per CTA: the argmax and the two ExpSums (as greedy), then a radix
// select of the K-th best logit order (four 8-bit digits, from the top), then an ordered
// compaction: every element above the threshold and the lowest-id ones at it, ascending ids.
__global__ void __launch_bounds__(kThreads) sample_candidates_kernel(const CandidateSampleParams p) {
  using Partials = unsigned long long[kWarps];
  using Histogram = int[256];
  using Counts = int[2 * kWarps];  // each warp's elements above, then at, the threshold
  FP8SERVE_SHARED(Partials, keys);
  FP8SERVE_SHARED(Partials, sums_hi);
  FP8SERVE_SHARED(Partials, sums_lo);
  FP8SERVE_SHARED(Histogram, histogram);
  FP8SERVE_SHARED(Counts, warp_counts);
  FP8SERVE_SHARED(int[2], select);  // the chosen digit, the count still to take below it
  const int64_t vocab = p.vocab_size;
  const float* row = p.logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int k = vocab < p.num_candidates ? static_cast<int>(vocab) : p.num_candidates;

  const float max_logit = row[sample_key_id(block_best_key(row, vocab, keys))];
  const float inv_t = p.inv_temperature[blockIdx.x];
  ExpSum raw, scaled;
  for_each_logit(row, vocab, [&](float logit, int64_t) {
    raw.add(softmax_term(logit, max_logit));
    scaled.add(scaled_term(logit, max_logit, inv_t));
  });
  raw = block_merge(raw, sums_hi, sums_lo);
  scaled = block_merge(scaled, sums_hi, sums_lo);
  if (threadIdx.x == 0) p.rows[blockIdx.x] = CandidateRow{max_logit, k, raw, scaled};

  // The K-th best order, a digit at a time: `prefix` holds the digits chosen so far, `remaining`
  // how many of the K are still to be found among the elements that share them.
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = static_cast<int>(threadIdx.x); b < 256; b += kThreads) histogram[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const uint32_t order = key_order(row[i], i);
      if ((order & mask) == prefix) atomicAdd(&histogram[(order >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, digit = 255;
      for (; digit > 0 && above + histogram[digit] < remaining; --digit) above += histogram[digit];
      select[0] = digit;
      select[1] = remaining - above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(select[0]) << shift;
    mask |= 255u << shift;
    remaining = select[1];
    __syncthreads();  // select is rewritten by the next digit
  }

  // Ordered compaction: above the threshold, or at it among the first `remaining` by id. Each
  // warp owns a contiguous run of ids (whole groups of 32), so the order is ids' order: a first
  // pass counts each warp's elements above and at the threshold, a second writes, each group of 32
  // placed by a ballot and the warps before it.
  int32_t* ids = p.ids + static_cast<int64_t>(blockIdx.x) * p.num_candidates;
  float* out_logits = p.candidate_logits + static_cast<int64_t>(blockIdx.x) * p.num_candidates;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t span = (vocab + kThreads - 1) / kThreads * kWarpSize;  // ids a warp owns
  const int64_t begin = warp * span, end = begin + span < vocab ? begin + span : vocab;
  // (a warp whose run starts past the vocabulary has none: end < begin)
  const unsigned lanes_below = (1u << lane) - 1u;
  // kAhead groups of 32 loaded, then each group's ballots (above, at) the threshold, in id order.
  auto for_each_group = [&](auto&& f) {
    for (int64_t base = begin; base < end; base += int64_t{kAhead} * kWarpSize) {
      float logit[kAhead];
FP8SERVE_UNROLL
      for (int u = 0; u < kAhead; ++u) {
        const int64_t i = base + int64_t{u} * kWarpSize + lane;
        logit[u] = i < end ? row[i] : 0.0f;
      }
FP8SERVE_UNROLL
      for (int u = 0; u < kAhead; ++u) {
        const int64_t i = base + int64_t{u} * kWarpSize + lane;
        const uint32_t order = i < end ? key_order(logit[u], i) : 0u;
        f(i, logit[u], __ballot_sync(kFullMask, i < end && order > prefix), __ballot_sync(kFullMask, i < end && order == prefix));
      }
    }
  };
  int above_count = 0, tie_count = 0;
  for_each_group([&](int64_t, float, unsigned above, unsigned tie) {
    above_count += __popc(above);
    tie_count += __popc(tie);
  });
  if (lane == 0) {
    warp_counts[warp] = above_count;
    warp_counts[kWarps + warp] = tie_count;
  }
  __syncthreads();
  int ties_before = 0, written = 0;  // by the warps before this one
  for (int w = 0; w < warp; ++w) {  // its elements above, and its ties among the first `remaining`
    const int ties = warp_counts[kWarps + w];
    written += warp_counts[w] + min(ties, max(remaining - ties_before, 0));
    ties_before += ties;
  }
  for_each_group([&](int64_t i, float logit, unsigned above, unsigned tie) {
    const bool take = (above >> lane & 1u) || ((tie >> lane & 1u) && ties_before + __popc(tie & lanes_below) < remaining);
    const unsigned takes = __ballot_sync(kFullMask, take);
    if (take) {
      const int slot = written + __popc(takes & lanes_below);
      ids[slot] = static_cast<int32_t>(i);
      out_logits[slot] = logit;
    }
    ties_before += __popc(tie);
    written += __popc(takes);
  });
}

// The host sampler's processing of each row (kernels/sampling_ops.hpp, LogitEdit), in place: the
// allow mask over the row, then each edit by one thread (at most one edit a token: no races).
__global__ void __launch_bounds__(kThreads) process_logits_kernel(const LogitProcessParams p) {
  float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.vocab_size;
  const int32_t mask = p.mask_index[blockIdx.x];
  if (mask >= 0) {
    const uint32_t* words = p.masks + static_cast<int64_t>(mask) * p.mask_words;
    for (int64_t i = threadIdx.x; i < p.vocab_size; i += kThreads)
      if (!(words[i / 32] >> (i % 32) & 1u)) row[i] = -INFINITY;
    __syncthreads();  // an edit's token may have been masked by another thread
  }
  for (int32_t e = p.edit_begin[blockIdx.x] + static_cast<int32_t>(threadIdx.x); e < p.edit_begin[blockIdx.x + 1]; e += kThreads) {
    const LogitEdit edit = p.edits[e];
    row[edit.token] = apply_logit_edit(row[edit.token], edit);
  }
}

}  // namespace

void process_logits_cuda(const LogitProcessParams& p, cudaStream_t stream) {
  const bool bad = p.num_rows < 0 || p.vocab_size < 1 || p.vocab_size > INT32_MAX || p.num_rows > INT32_MAX ||
                   p.mask_words != (p.vocab_size + 31) / 32;
  if (bad) throw std::invalid_argument("process_logits (cuda): bad shape");
  if (p.num_rows == 0) return;
  FP8SERVE_LAUNCH(process_logits_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kThreads), 0, stream, p);
  CUDA_CHECK(cudaGetLastError());
}

void sample_candidates_cuda(const CandidateSampleParams& p, cudaStream_t stream) {
  const bool bad = p.num_rows < 0 || p.vocab_size < 1 || p.vocab_size > INT32_MAX || p.num_rows > INT32_MAX ||
                   p.num_candidates < 1 || p.num_candidates > kMaxSampleCandidates;
  if (bad) throw std::invalid_argument("sample_candidates (cuda): bad shape or number of candidates");
  if (p.num_rows == 0) return;
  FP8SERVE_LAUNCH(sample_candidates_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kThreads), 0, stream, p);
  CUDA_CHECK(cudaGetLastError());
}

void sample_greedy_cuda(const GreedySampleParams& p, cudaStream_t stream) {
  const bool bad = p.num_rows < 0 || p.vocab_size < 1 || p.vocab_size > INT32_MAX || p.num_rows > INT32_MAX;
  if (bad) throw std::invalid_argument("sample_greedy (cuda): bad shape");
  if (p.num_rows == 0) return;
  FP8SERVE_LAUNCH(sample_greedy_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kThreads), 0, stream, p.logits,
                  p.vocab_size, p.out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
