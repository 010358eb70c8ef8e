// Sampling on the GPU (kernels/backend.hpp, sample_greedy): the greedy pick of each row and what
// its logprob needs, so that a step of greedy sequences brings back 24 bytes a row instead of the
// row's fp32 logits (500 KiB at a 128k vocabulary).
//
// Exactly the host sampler's results (server/engine/sampling.cpp), by construction rather than by
// tolerance: the argmax is an integer max over sample_key() (the host's order, ties to the lowest
// id), and the softmax denominator an ExpSum (kernels/sampling_ops.hpp), whose fixed-point sum
// does not depend on the order of the additions, of terms exp_nonpositive() computes with the same
// IEEE operations as the host (no libm or CUDA exp(), whose last bits differ).
//
// Launches: a row is cut into slices of consecutive ids, a 512-thread CTA each (sampling_slices():
// enough CTAs for the GPU at any batch), and each launch passes over the slice once, its partials
// combined exactly by the next: greedy takes three (each slice's best key; each slice's sum of
// exp(l - max); each row's pick), the top-k prefilter five (best keys and the first radix digit's
// histogram; the two sums and the second digit's; the third's; the threshold and each warp's
// counts; the ordered compaction). The passes after the first mostly hit L2 (a batch of 64 rows at 128k is 32 MiB).
// docs/cuda.md, "Sampling on the GPU".
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/sampling_ops.hpp"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / kWarpSize;

// exp_nonpositive's table (kernels/sampling_ops.hpp), in global memory for each CTA to copy to shared.
__device__ const Exp2Table kExp2TableDevice = kExp2ThirtySeconds;

// Its other constants, operands of the instructions.
__constant__ ExpCoefficients kExpCoefficientsDevice = kExpCoefficients;

// The table in shared memory (32 floats on 32 banks: a warp's lookups take one wavefront); the
// caller synchronizes before the first use.
FP8SERVE_DEVICE void load_exp_table(float* table) {
  if (threadIdx.x < 32) table[threadIdx.x] = kExp2TableDevice.at[threadIdx.x];
}

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
    other.bits = __shfl_xor_sync(kFullMask, static_cast<unsigned long long>(s.bits), offset);
    s.merge(other);
  }
  return s;
}

// The largest of `key` over the block (every thread gets it); 0, below every element's key (an
// id's low half is never all ones for the ids a row has), is the identity.
// scratch: __shared__ unsigned long long[kWarps].
FP8SERVE_DEVICE unsigned long long block_max_key(unsigned long long key, unsigned long long* scratch) {
  key = warp_max_u64(key);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (lane == 0) scratch[threadIdx.x / kWarpSize] = key;
  __syncthreads();
  return warp_max_u64(lane < kWarps ? scratch[lane] : 0ull);
}

// The block's ExpSums merged (exact: any order gives the same bits); the result in thread 0.
// scratch: __shared__ unsigned long long[kWarps], free again on return.
FP8SERVE_DEVICE ExpSum block_merge(ExpSum s, unsigned long long* scratch) {
  s = warp_merge(s);
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = s.bits;
  __syncthreads();
  ExpSum total;
  if (threadIdx.x == 0)
    for (int w = 0; w < kWarps; ++w) total.merge(ExpSum{scratch[w]});
  __syncthreads();
  return total;
}

// ---- a row in slices ----------------------------------------------------------------------------
//
// A row is cut into `slices` runs of consecutive ids, one CTA each (blockIdx.x the row, blockIdx.y
// the slice), so that a few rows still fill the GPU. Each launch leaves per-slice partials in the
// workspace, which the next launch's CTAs combine exactly (an integer max, ExpSum merges, integer
// histograms and counts): the results do not depend on the number of slices, nor on the batch.

constexpr int kMaxSlices = kWarpSize;  // a warp combines a row's partials, a lane a slice
// The radix select's digits of the 32-bit logit order, from the top: 11, 11 and 10 bits (three
// passes, the first fused into the best keys' pass, the second into the sums'). A digit's
// histogram has kRadixBins bins.
constexpr int kRadixPasses = 3;
constexpr int kRadixBins = 2048;
constexpr int kBinsPerThread = kRadixBins / kThreads;
__host__ __device__ constexpr int digit_shift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
static_assert(kMaxSlices <= kWarpSize && kWarps <= kWarpSize, "a warp's lanes take a row's slices, a CTA's warps");
static_assert(kRadixBins == kBinsPerThread * kThreads, "each thread takes kBinsPerThread bins");
static_assert(digit_shift(0) + 11 == 32 && digit_shift(1) + 11 == digit_shift(0) && digit_shift(2) + 10 == digit_shift(1),
              "the digits tile the 32 bits, none wider than kRadixBins");

struct SliceWorkspace {
  unsigned long long* keys;  // [rows][slices] each slice's best sample_key
  ExpSum* sums;              // [rows][slices][2] each slice's raw, then scaled, ExpSum
  int* histograms[2];        // [rows][slices][kRadixBins] a radix pass's digits (two: read one, write the other)
  // Pass p's histograms (a select, not an index: an indexed parameter array would live in local memory).
  FP8SERVE_DEVICE int* histogram_of(int pass) const { return pass & 1 ? histograms[1] : histograms[0]; }
  int* state;                // [rows][kRadixPasses][2] prefix and count still to take, after each pass
  int* warp_counts;          // [rows][slices][kWarps][2] each warp's elements above, at, the threshold
  int* slice_counts;         // [rows][slices][2] the same for the slice
};

std::size_t align_up(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// The workspace laid out for `rows` x `slices` (a null base: only its size).
SliceWorkspace slice_workspace(void* base, int64_t rows, int slices, std::size_t* bytes) {
  const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(slices);
  auto* at = static_cast<unsigned char*>(base);
  std::size_t used = 0;
  auto take = [&](std::size_t size) {
    void* p = at == nullptr ? nullptr : at + used;
    used += align_up(size);
    return p;
  };
  SliceWorkspace w;
  w.keys = static_cast<unsigned long long*>(take(n * sizeof(unsigned long long)));
  w.sums = static_cast<ExpSum*>(take(n * 2 * sizeof(ExpSum)));
  w.histograms[0] = static_cast<int*>(take(n * kRadixBins * sizeof(int)));
  w.histograms[1] = static_cast<int*>(take(n * kRadixBins * sizeof(int)));
  w.state = static_cast<int*>(take(static_cast<std::size_t>(rows) * kRadixPasses * 2 * sizeof(int)));
  w.warp_counts = static_cast<int*>(take(n * kWarps * 2 * sizeof(int)));
  w.slice_counts = static_cast<int*>(take(n * 2 * sizeof(int)));
  if (bytes != nullptr) *bytes = used;
  return w;
}

struct Slice {
  const float* row;  // the row's first logit
  int begin, end;    // ids: a vocabulary has at most ExpSum::kMaxTerms
  int index;         // of this CTA's row's partials: row * slices + slice
  int row_index;
};

FP8SERVE_DEVICE Slice this_slice(const float* logits, int64_t vocab, int64_t slice_len) {
  Slice s;
  s.row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * slice_len;
  s.begin = static_cast<int>(begin);
  s.end = static_cast<int>(begin + slice_len < vocab ? begin + slice_len : vocab);
  s.row_index = static_cast<int>(blockIdx.x);
  s.index = static_cast<int>(blockIdx.x * gridDim.y + blockIdx.y);
  return s;
}

// A histogram's bins zeroed, or copied out, kBinsPerThread a thread (straight code: no loop).
FP8SERVE_DEVICE void zero_bins(int* histogram) {
FP8SERVE_UNROLL
  for (int j = 0; j < kBinsPerThread; ++j) histogram[threadIdx.x + j * kThreads] = 0;
}
FP8SERVE_DEVICE void copy_bins(const int* histogram, int* out) {
FP8SERVE_UNROLL
  for (int j = 0; j < kBinsPerThread; ++j) out[threadIdx.x + j * kThreads] = histogram[threadIdx.x + j * kThreads];
}

// f(logit, id) for this thread's ids of the slice (begin + threadIdx.x, + kThreads, ..) in order,
// with kAhead loads in flight before the first is used: a pass waits a round trip per kAhead
// elements, not per element. The ids past the slice's end get `pad` (with no branch on them): for
// sums to which pad adds nothing; for_each_logit leaves them out.
constexpr int kAhead = 4;
template <class F>
FP8SERVE_DEVICE void for_each_logit_padded(const Slice& s, float pad, F&& f) {
  for (int base = s.begin + static_cast<int>(threadIdx.x); base < s.end; base += kAhead * kThreads) {
    float logit[kAhead];
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + u * kThreads;
      logit[u] = i < s.end ? s.row[i] : pad;
    }
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) f(logit[u], base + u * kThreads);
  }
}
template <class F>
FP8SERVE_DEVICE void for_each_logit(const Slice& s, F&& f) {
  for_each_logit_padded(s, 0.0f, [&](float logit, int i) {
    if (i < s.end) f(logit, i);
  });
}

// The row's best key from its slices' (each warp combines them itself: no barrier).
FP8SERVE_DEVICE unsigned long long row_best_key(const unsigned long long* keys, int row, int slices) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  return warp_max_u64(lane < slices ? keys[row * slices + lane] : 0ull);
}

// The merge of the row's slices' ExpSums `which` (0 raw, 1 scaled), in every lane.
FP8SERVE_DEVICE ExpSum row_sum(const ExpSum* sums, int row, int slices, int which) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  return warp_merge(lane < slices ? sums[(row * slices + lane) * 2 + which] : ExpSum{});
}

FP8SERVE_DEVICE uint32_t key_order(float logit, int id) {
  return static_cast<uint32_t>(sample_key(logit, id) >> 32);
}

// K: the candidates a row gives (all of a vocabulary smaller than K).
FP8SERVE_DEVICE int candidates_per_row(const CandidateSampleParams& p) {
  return p.vocab_size < p.num_candidates ? static_cast<int>(p.vocab_size) : p.num_candidates;
}

// The slice's best key over the block (every thread gets it), `also(key)` called for each id's key.
// scratch: __shared__ unsigned long long[kWarps].
template <class F>
FP8SERVE_DEVICE unsigned long long slice_best_key(const Slice& s, unsigned long long* scratch, F&& also) {
  unsigned long long best = 0;
  for_each_logit(s, [&](float logit, int i) {
    const unsigned long long key = sample_key(logit, i);
    best = key > best ? key : best;
    also(key);
  });
  return block_max_key(best, scratch);
}

// Launch 1, greedy: each slice's best key.
__global__ void __launch_bounds__(kThreads) sample_best_kernel(const float* logits, int64_t vocab, int64_t slice_len,
                                                               unsigned long long* keys) {
  FP8SERVE_SHARED(unsigned long long[kWarps], scratch);
  const Slice s = this_slice(logits, vocab, slice_len);
  const unsigned long long best = slice_best_key(s, scratch, [](unsigned long long) {});
  if (threadIdx.x == 0) keys[s.index] = best;
}

// Launch 1, candidates: each slice's best key, and the histogram of its first digit.
__global__ void __launch_bounds__(kThreads) sample_first_pass_kernel(const float* logits, int64_t vocab,
                                                                     int64_t slice_len, SliceWorkspace w) {
  FP8SERVE_SHARED(unsigned long long[kWarps], scratch);
  FP8SERVE_SHARED(int[kRadixBins], histogram);
  zero_bins(histogram);
  const Slice s = this_slice(logits, vocab, slice_len);
  __syncthreads();  // histogram
  const unsigned long long best = slice_best_key(s, scratch, [&](unsigned long long key) {
    atomicAdd(&histogram[static_cast<uint32_t>(key >> 32) >> digit_shift(0)], 1);
  });  // (block_max_key's barrier also ends the histogram's atomics)
  if (threadIdx.x == 0) w.keys[s.index] = best;
  copy_bins(histogram, w.histogram_of(0) + static_cast<int64_t>(s.index) * kRadixBins);
}

// Launch 2, greedy: each slice's sum of exp(l - max).
__global__ void __launch_bounds__(kThreads) sample_greedy_sums_kernel(const float* logits, int64_t vocab,
                                                                      int64_t slice_len, SliceWorkspace w) {
  FP8SERVE_SHARED(unsigned long long[kWarps], sums);
  FP8SERVE_SHARED(float[32], exp_table);
  load_exp_table(exp_table);
  const Slice s = this_slice(logits, vocab, slice_len);
  const float max_logit = s.row[sample_key_id(row_best_key(w.keys, s.row_index, static_cast<int>(gridDim.y)))];
  __syncthreads();  // exp_table
  ExpSum sum;
  // (a pad of -inf adds exp(-inf) = 0: to a NaN row's sum too, which its max already marked)
  for_each_logit_padded(s, -INFINITY, [&](float logit, int) {
    add_exp(sum, logit - max_logit, exp_table, kExpCoefficientsDevice);
  });
  sum = block_merge(sum, sums);
  if (threadIdx.x == 0) w.sums[s.index * 2] = sum;
}

// Launch 3, greedy: each row's pick, from its slices' partials (one warp a row).
__global__ void __launch_bounds__(kWarpSize) sample_greedy_rows_kernel(const float* logits, int64_t vocab, int slices,
                                                                       SliceWorkspace w, GreedyRow* out) {
  const int row = static_cast<int>(blockIdx.x);
  const int32_t token = sample_key_id(row_best_key(w.keys, row, slices));
  const ExpSum sum = row_sum(w.sums, row, slices, 0);
  if (threadIdx.x == 0) out[row] = GreedyRow{token, logits[static_cast<int64_t>(row) * vocab + token], sum};
}

// The radix select's state after pass `pass` (its digit chosen from the slices' summed histograms),
// given the state before it; every CTA of the row computes the same. The digit is the one a scan
// from the top bin down would stop at, adding the bins above: the highest whose bins from it up
// hold `remaining` (0 if none). Here thread t holds bins top - 4t .. top - 4t - 3, so a scan over the
// threads gives each bin the count from it up, and the one thread whose bin crosses `remaining`
// writes the choice. thread_sums: shared, kWarps; chosen: shared, 2.
struct Selection {
  uint32_t prefix = 0, mask = 0;  // the digits chosen so far, and which bits they are
  int remaining = 0;              // how many of the K are still to be found among the elements that share them
};
FP8SERVE_DEVICE Selection select_digit(const SliceWorkspace& w, int row, int slices, int pass, int k, int* warp_sums,
                                       int* chosen) {
  Selection before;
  before.remaining = k;
  if (pass > 0) {
    before.prefix = static_cast<uint32_t>(w.state[(row * kRadixPasses + pass - 1) * 2]);
    before.remaining = w.state[(row * kRadixPasses + pass - 1) * 2 + 1];
    before.mask = ~0u << digit_shift(pass - 1);
  }
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarpSize, top = kRadixBins - 1 - t * kBinsPerThread;
  int count[kBinsPerThread] = {};
  const int* in = w.histogram_of(pass) + static_cast<int64_t>(row) * slices * kRadixBins;
  for (int sl = 0; sl < slices; ++sl)
FP8SERVE_UNROLL
    for (int j = 0; j < kBinsPerThread; ++j) count[j] += in[sl * kRadixBins + top - j];
  int mine = 0;
FP8SERVE_UNROLL
  for (int j = 0; j < kBinsPerThread; ++j) mine += count[j];
  int upto = mine;  // this thread's bins and those of the threads before it in the warp (the bins above)
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int before_lane = __shfl_up_sync(kFullMask, upto, offset);
    if (lane >= offset) upto += before_lane;
  }
  if (lane == kWarpSize - 1) warp_sums[t / kWarpSize] = upto;
  __syncthreads();
  for (int wp = 0; wp < t / kWarpSize; ++wp) upto += warp_sums[wp];
  int from_here = upto - mine;  // the bins above this thread's
FP8SERVE_UNROLL
  for (int j = 0; j < kBinsPerThread; ++j) {
    const int above = from_here;
    from_here += count[j];
    if ((top - j == 0 || from_here >= before.remaining) && above < before.remaining) {
      chosen[0] = top - j;
      chosen[1] = before.remaining - above;
    }
  }
  __syncthreads();
  Selection after;
  after.prefix = before.prefix | static_cast<uint32_t>(chosen[0]) << digit_shift(pass);
  after.mask = ~0u << digit_shift(pass);
  after.remaining = chosen[1];
  if (threadIdx.x == 0 && blockIdx.y == 0) {  // for the next launches (no CTA of this one reads it)
    w.state[(row * kRadixPasses + pass) * 2] = static_cast<int>(after.prefix);
    w.state[(row * kRadixPasses + pass) * 2 + 1] = after.remaining;
  }
  return after;
}

// Adds an element's digit of pass `pass` to a shared histogram, if it shares the digits chosen so far.
FP8SERVE_DEVICE void count_digit(int* histogram, const Selection& sel, uint32_t order, int pass) {
  if ((order & sel.mask) == sel.prefix) atomicAdd(&histogram[(order & ~sel.mask) >> digit_shift(pass)], 1);
}

// Launch 2, candidates: the first digit chosen, then each slice's two ExpSums and the histogram
// of its second digit among the elements that share the first.
__global__ void __launch_bounds__(kThreads, 2) sample_candidate_sums_kernel(const CandidateSampleParams p, int64_t slice_len,
                                                                         SliceWorkspace w) {
  FP8SERVE_SHARED(unsigned long long[kWarps], sums);
  FP8SERVE_SHARED(float[32], exp_table);
  FP8SERVE_SHARED(int[kRadixBins], histogram);
  FP8SERVE_SHARED(int[kWarps], warp_sums);
  FP8SERVE_SHARED(int[2], chosen);
  load_exp_table(exp_table);
  zero_bins(histogram);
  const Slice s = this_slice(p.logits, p.vocab_size, slice_len);
  const int k = candidates_per_row(p);
  // (select_digit's barriers also order the table's and the histogram's stores before the loop)
  const Selection sel = select_digit(w, s.row_index, static_cast<int>(gridDim.y), 0, k, warp_sums, chosen);
  const float max_logit = s.row[sample_key_id(row_best_key(w.keys, s.row_index, static_cast<int>(gridDim.y)))];
  const float inv_t = p.inv_temperature[s.row_index];
  const bool raw_wanted = p.raw_sum_wanted == nullptr || p.raw_sum_wanted[s.row_index] != 0;
  ExpSum raw, scaled;
  // The raw sum where wanted; at 1/T = 1 it is the scaled one ((l - max) * 1 is l - max, exactly).
  // (A pad of -inf adds 0 to the sums, as for greedy; the histogram leaves it out.)
  auto pass = [&](auto with_raw) {
    for_each_logit_padded(s, -INFINITY, [&](float logit, int i) {
      if constexpr (decltype(with_raw)::value) add_exp(raw, logit - max_logit, exp_table, kExpCoefficientsDevice);
      add_exp(scaled, (logit - max_logit) * inv_t, exp_table, kExpCoefficientsDevice);
      if (i < s.end) count_digit(histogram, sel, key_order(logit, i), 1);
    });
  };
  const bool both = raw_wanted && inv_t != 1.0f;  // (uniform over the CTA: one row)
  both ? pass(std::true_type{}) : pass(std::false_type{});
  scaled = block_merge(scaled, sums);  // (its barriers also end the histogram's atomics)
  raw = both ? block_merge(raw, sums) : raw_wanted ? scaled : ExpSum{};
  if (threadIdx.x == 0) w.sums[s.index * 2] = raw, w.sums[s.index * 2 + 1] = scaled;
  copy_bins(histogram, w.histogram_of(1) + static_cast<int64_t>(s.index) * kRadixBins);
}

// Launch 3, candidates (pass 2, the last): pass `pass - 1`'s digit chosen, the histogram of pass
// `pass`'s digit among the slice's elements that share the digits chosen so far.
__global__ void __launch_bounds__(kThreads) sample_radix_kernel(const CandidateSampleParams p, int64_t slice_len,
                                                                SliceWorkspace w, int pass) {
  FP8SERVE_SHARED(int[kRadixBins], histogram);
  FP8SERVE_SHARED(int[kWarps], warp_sums);
  FP8SERVE_SHARED(int[2], chosen);
  const Slice s = this_slice(p.logits, p.vocab_size, slice_len);
  const int slices = static_cast<int>(gridDim.y);
  const int k = candidates_per_row(p);
  const Selection sel = select_digit(w, s.row_index, slices, pass - 1, k, warp_sums, chosen);
  zero_bins(histogram);
  __syncthreads();
  for_each_logit(s, [&](float logit, int i) {
    count_digit(histogram, sel, key_order(logit, i), pass);
  });
  __syncthreads();
  int* out = w.histogram_of(pass) + static_cast<int64_t>(s.index) * kRadixBins;
  copy_bins(histogram, out);
}

// The compaction's walk over a warp's run of the slice's ids (whole groups of 32, so in id order):
// kAhead groups loaded, then each group's ballots (above, at) the threshold `order`, in id order.
struct WarpRun {
  int begin, end;
};
FP8SERVE_DEVICE WarpRun warp_run(const Slice& s) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int span = (s.end - s.begin + kThreads - 1) / kThreads * kWarpSize;  // ids a warp owns
  WarpRun r;
  r.begin = s.begin + warp * span;
  r.end = r.begin + span < s.end ? r.begin + span : s.end;  // (a run past the slice's end is empty)
  return r;
}
template <class F>
FP8SERVE_DEVICE void for_each_group(const Slice& s, const WarpRun& run, uint32_t threshold, F&& f) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int base = run.begin; base < run.end; base += kAhead * kWarpSize) {
    float logit[kAhead];
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + u * kWarpSize + lane;
      logit[u] = i < run.end ? s.row[i] : 0.0f;
    }
FP8SERVE_UNROLL
    for (int u = 0; u < kAhead; ++u) {
      const int i = base + u * kWarpSize + lane;
      const uint32_t order = i < run.end ? key_order(logit[u], i) : 0u;
      f(i, logit[u], __ballot_sync(kFullMask, i < run.end && order > threshold),
        __ballot_sync(kFullMask, i < run.end && order == threshold));
    }
  }
}

// Launch 4, candidates: the last digit chosen (the threshold: the K-th best order), then each
// warp's count of the slice's elements above and at it, and the slice's.
__global__ void __launch_bounds__(kThreads) sample_count_kernel(const CandidateSampleParams p, int64_t slice_len,
                                                                SliceWorkspace w) {
  FP8SERVE_SHARED(int[kWarps], warp_sums);
  FP8SERVE_SHARED(int[2], chosen);
  FP8SERVE_SHARED(int[2 * kWarps], counts);
  const Slice s = this_slice(p.logits, p.vocab_size, slice_len);
  const int k = candidates_per_row(p);
  const Selection sel = select_digit(w, s.row_index, static_cast<int>(gridDim.y), kRadixPasses - 1, k, warp_sums, chosen);
  int above = 0, ties = 0;
  for_each_group(s, warp_run(s), sel.prefix, [&](int, float, unsigned a, unsigned t) {
    above += __popc(a);
    ties += __popc(t);
  });
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) {
    w.warp_counts[(s.index * kWarps + warp) * 2] = above;
    w.warp_counts[(s.index * kWarps + warp) * 2 + 1] = ties;
    counts[warp] = above;
    counts[kWarps + warp] = ties;
  }
  __syncthreads();
  if (threadIdx.x < 2) {
    int total = 0;
    for (int wp = 0; wp < kWarps; ++wp) total += counts[threadIdx.x * kWarps + wp];
    w.slice_counts[s.index * 2 + threadIdx.x] = total;
  }
}

// Launch 5, candidates: the ordered compaction. Every element above the threshold, and the first
// `remaining` at it by id: what comes before a warp's run (the slices before, the warps before in
// this slice) is `above` of them plus min(ties, remaining) of their ties, each group of 32 placed by
// a ballot. Slice 0 writes the row's header.
__global__ void __launch_bounds__(kThreads) sample_write_kernel(const CandidateSampleParams p, int64_t slice_len,
                                                                SliceWorkspace w) {
  const Slice s = this_slice(p.logits, p.vocab_size, slice_len);
  const int slices = static_cast<int>(gridDim.y), slice = static_cast<int>(blockIdx.y), row = s.row_index;
  const int k = candidates_per_row(p);
  const uint32_t threshold = static_cast<uint32_t>(w.state[(row * kRadixPasses + kRadixPasses - 1) * 2]);
  const int remaining = w.state[(row * kRadixPasses + kRadixPasses - 1) * 2 + 1];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  // Counts before this warp's run: lane l adds slice l's (l < slice) and this slice's warp l's (l < warp).
  int above = 0, ties = 0;
  if (lane < slice) {
    above += w.slice_counts[(row * slices + lane) * 2];
    ties += w.slice_counts[(row * slices + lane) * 2 + 1];
  }
  if (lane < warp) {
    above += w.warp_counts[(s.index * kWarps + lane) * 2];
    ties += w.warp_counts[(s.index * kWarps + lane) * 2 + 1];
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    above += __shfl_xor_sync(kFullMask, above, offset);
    ties += __shfl_xor_sync(kFullMask, ties, offset);
  }
  int ties_before = ties, written = above + min(ties, remaining);
  int32_t* ids = p.ids + static_cast<int64_t>(row) * p.num_candidates;
  float* out_logits = p.candidate_logits + static_cast<int64_t>(row) * p.num_candidates;
  const unsigned lanes_below = (1u << lane) - 1u;
  for_each_group(s, warp_run(s), threshold, [&](int i, float logit, unsigned a, unsigned t) {
    if ((a | t) == 0) return;  // most groups hold no candidate (K of the row's ids); a and t are the warp's
    const bool take = (a >> lane & 1u) || ((t >> lane & 1u) && ties_before + __popc(t & lanes_below) < remaining);
    const unsigned takes = __ballot_sync(kFullMask, take);
    if (take) {
      const int slot = written + __popc(takes & lanes_below);
      ids[slot] = static_cast<int32_t>(i);
      out_logits[slot] = logit;
    }
    ties_before += __popc(t);
    written += __popc(takes);
  });
  if (slice == 0 && warp == 0) {
    const float max_logit = s.row[sample_key_id(row_best_key(w.keys, row, slices))];
    const ExpSum raw = row_sum(w.sums, row, slices, 0), scaled = row_sum(w.sums, row, slices, 1);
    if (lane == 0) p.rows[row] = CandidateRow{max_logit, k, raw, scaled};
  }
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

// How many slices a row is cut into: about kTargetCtas CTAs in all (2 a SM on 132 SMs, rounded down
// so that the CTAs spread evenly) when the rows are few, each slice at least kMinSlice ids, at most
// kMaxSlices; none empty. `asked` > 0 (tests) takes that many, at most kMaxSlices and one an id.
constexpr int64_t kTargetCtas = 264;
constexpr int64_t kMinSlice = 2048;
int sampling_slices(int64_t rows, int64_t vocab, int32_t asked) {
  int64_t slices = asked > 0 ? asked : std::min(kTargetCtas / std::max<int64_t>(rows, 1), div_up(vocab, kMinSlice));
  slices = std::clamp<int64_t>(slices, 1, std::min<int64_t>(kMaxSlices, vocab));
  return static_cast<int>(div_up(vocab, div_up(vocab, slices)));
}

std::size_t sampling_workspace_bytes(int64_t rows, int64_t vocab, int32_t slices) {
  std::size_t bytes = 0;
  if (rows > 0 && vocab > 0) slice_workspace(nullptr, rows, sampling_slices(rows, vocab, slices), &bytes);
  return bytes;
}

namespace {
SliceWorkspace checked_workspace(void* workspace, std::size_t workspace_bytes, int64_t rows, int slices, const char* what) {
  std::size_t bytes = 0;
  const SliceWorkspace w = slice_workspace(workspace, rows, slices, &bytes);
  if (workspace == nullptr || workspace_bytes < bytes)
    throw std::invalid_argument(std::string(what) + ": workspace smaller than sampling_workspace_bytes()");
  return w;
}
}  // namespace

void sample_candidates_cuda(const CandidateSampleParams& p, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const bool bad = p.num_rows < 0 || p.num_rows > INT32_MAX / kMaxSlices || p.vocab_size < 1 || p.vocab_size > ExpSum::kMaxTerms ||
                   p.num_candidates < 1 || p.num_candidates > kMaxSampleCandidates || p.slices < 0;
  if (bad) throw std::invalid_argument("sample_candidates (cuda): bad shape or number of candidates");
  if (p.num_rows == 0) return;
  const int slices = sampling_slices(p.num_rows, p.vocab_size, p.slices);
  const int64_t slice_len = div_up(p.vocab_size, slices);
  const SliceWorkspace w = checked_workspace(workspace, workspace_bytes, p.num_rows, slices, "sample_candidates (cuda)");
  const dim3 grid(static_cast<unsigned>(p.num_rows), static_cast<unsigned>(slices));
  FP8SERVE_LAUNCH(sample_first_pass_kernel, grid, dim3(kThreads), 0, stream, p.logits, p.vocab_size, slice_len, w);
  FP8SERVE_LAUNCH(sample_candidate_sums_kernel, grid, dim3(kThreads), 0, stream, p, slice_len, w);
  for (int pass = 2; pass < kRadixPasses; ++pass)
    FP8SERVE_LAUNCH(sample_radix_kernel, grid, dim3(kThreads), 0, stream, p, slice_len, w, pass);
  FP8SERVE_LAUNCH(sample_count_kernel, grid, dim3(kThreads), 0, stream, p, slice_len, w);
  FP8SERVE_LAUNCH(sample_write_kernel, grid, dim3(kThreads), 0, stream, p, slice_len, w);
  CUDA_CHECK(cudaGetLastError());
}

void sample_greedy_cuda(const GreedySampleParams& p, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const bool bad = p.num_rows < 0 || p.num_rows > INT32_MAX / kMaxSlices || p.vocab_size < 1 || p.vocab_size > ExpSum::kMaxTerms ||
                   p.slices < 0;
  if (bad) throw std::invalid_argument("sample_greedy (cuda): bad shape");
  if (p.num_rows == 0) return;
  const int slices = sampling_slices(p.num_rows, p.vocab_size, p.slices);
  const int64_t slice_len = div_up(p.vocab_size, slices);
  const SliceWorkspace w = checked_workspace(workspace, workspace_bytes, p.num_rows, slices, "sample_greedy (cuda)");
  const dim3 grid(static_cast<unsigned>(p.num_rows), static_cast<unsigned>(slices));
  FP8SERVE_LAUNCH(sample_best_kernel, grid, dim3(kThreads), 0, stream, p.logits, p.vocab_size, slice_len, w.keys);
  FP8SERVE_LAUNCH(sample_greedy_sums_kernel, grid, dim3(kThreads), 0, stream, p.logits, p.vocab_size, slice_len, w);
  FP8SERVE_LAUNCH(sample_greedy_rows_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kWarpSize), 0, stream, p.logits,
                  p.vocab_size, slices, w, p.out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp8serve::cuda
