#pragma once
// Sampling arithmetic shared by the host sampler (server/engine/sampling.cpp) and the device's sampling
// kernels (kernels/cuda/sampling.cu), so that both compute the same bits:
//
//   - ExpSum: the sum of a row's exp(l - max) terms, which log-softmax (the reported logprobs)
//     needs. A sum of doubles depends on the order of its additions, and a device reduces in an
//     order a host loop cannot follow cheaply. So each term (in [0, 1]) is truncated to a fixed
//     point of 2^-100 and the integers are added: integer addition is associative, so the sum is
//     exact and the same in any order, on any number of threads. 2^-100 is far below a double's
//     precision at the sum (>= 1: the maximum's own term), and 2^17 terms of at most 2^100 fit
//     the 128 bits, so the value differs from an exact real sum by < vocab * 2^-100.
//   - SampleKey: the argmax order of the host (`>` from the lowest id: the highest logit, ties to
//     the lowest id, -0 equal to +0; a NaN is never chosen, except at id 0, where the host's loop
//     starts and no value beats it) as one 64-bit integer, so that an argmax is an integer max.
//   - GreedySampleParams / GreedyRow: the device argmax of kernels/backend.hpp's sample_greedy();
//     CandidateSampleParams / CandidateRow: its top-k prefilter, sample_candidates().
//   - LogitEdit / LogitProcessParams: the host sampler's logit processors and penalties applied
//     to the device's rows first (process_logits()), each as the host computes it.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SAMPLING_HD __host__ __device__ __forceinline__
#else
#define SAMPLING_HD inline
#endif

namespace fp8serve {

struct ExpSum {
  // value = (hi * 2^64 + lo) * 2^-100; hi == kNaN marks a NaN term (sticky).
  uint64_t hi = 0;
  uint64_t lo = 0;
  static constexpr uint64_t kNaN = ~uint64_t{0};

  // Adds one term in [0, 1] (exp of a non-positive number); anything else (NaN: an inf - inf
  // or a NaN logit) makes the sum NaN, as it makes the host's double sum NaN.
  SAMPLING_HD void add(double term) {
    if (!(term >= 0.0 && term <= 1.0)) {
      hi = kNaN;
      return;
    }
    // term * 2^36 is exact; its integer part and fraction split exactly; the fraction times 2^64
    // is exact and its truncation drops only the bits below 2^-100.
    const double scaled = term * 0x1.0p36;
    const double whole = ::floor(scaled);
    merge(ExpSum{static_cast<uint64_t>(whole), static_cast<uint64_t>((scaled - whole) * 0x1.0p64)});
  }
  SAMPLING_HD void merge(const ExpSum& other) {
    if (hi == kNaN || other.hi == kNaN) {
      hi = kNaN;
      return;
    }
    const uint64_t low = lo + other.lo;
    hi += other.hi + (low < lo ? 1u : 0u);
    lo = low;
  }
  // The sum as a double (rounded once from the exact value's two halves, the same way everywhere).
  SAMPLING_HD double value() const {
    if (hi == kNaN) return NAN;
    return (static_cast<double>(hi) + static_cast<double>(lo) * 0x1.0p-64) * 0x1.0p-36;
  }
};

// One term of the raw row's log-softmax: exp(l - max), the difference rounded in fp32 as the host
// has always computed it.
SAMPLING_HD double softmax_term(float logit, float max_logit) { return ::exp(static_cast<double>(logit - max_logit)); }

// One temperature-scaled weight relative to the maximum, exp((l - max) / T): the difference and
// the product by 1/T rounded in fp32, as the host's draw has always computed them.
SAMPLING_HD double scaled_term(float logit, float max_logit, float inv_temperature) {
  return ::exp(static_cast<double>((logit - max_logit) * inv_temperature));
}

// log p(token) from the token's logit, the row's maximum and its ExpSum.
SAMPLING_HD float log_softmax_of(float logit, float max_logit, const ExpSum& sum) {
  const double log_z = static_cast<double>(max_logit) + ::log(sum.value());
  return static_cast<float>(static_cast<double>(logit) - log_z);
}

// Orders (logit, id) as the host's argmax does: a larger key wins. The logit's bits made
// monotonic (after -0 -> +0) in the high half, the inverted id in the low half (lower id wins).
SAMPLING_HD uint64_t sample_key(float logit, int32_t id) {
  uint32_t order = 0;  // NaN: below every number (never chosen)...
  if (logit == logit) {
    const float v = logit == 0.0f ? 0.0f : logit;
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    order = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  } else if (id == 0) {
    order = ~0u;  // ...except at id 0, which the host's loop keeps when nothing compares greater
  }
  return (static_cast<uint64_t>(order) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}
SAMPLING_HD int32_t sample_key_id(uint64_t key) {
  return static_cast<int32_t>(~static_cast<uint32_t>(key & 0xffffffffu));
}

// The device's greedy pick for one row: the argmax of the raw logits and what the logprob of it
// needs (the row's maximum and ExpSum; for a row without NaN the maximum is the token's logit).
struct GreedyRow {
  int32_t token = 0;
  float max_logit = 0.0f;
  ExpSum sum;
};

struct GreedySampleParams {
  const float* logits = nullptr;  // [num_rows, vocab_size] fp32, device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  GreedyRow* out = nullptr;       // [num_rows], device
};

// The device's top-k prefilter (Backend::sample_candidates): each row's best candidates, by the
// host's order (logit, then the lower id), and what the host's draw and logprobs need of the rest.
constexpr int32_t kMaxSampleCandidates = 1024;

struct CandidateRow {
  float max_logit = 0.0f;      // the row's maximum
  int32_t num_candidates = 0;  // min(K, vocab_size)
  ExpSum raw_sum;              // sum of exp(l - max): log-softmax of the raw row
  ExpSum scaled_sum;           // sum of exp((l - max) / T): top-p's total over the whole row
};

struct CandidateSampleParams {
  const float* logits = nullptr;           // [num_rows, vocab_size] fp32, device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  const float* inv_temperature = nullptr;  // [num_rows] 1/T in fp32 (as the host computes it), device
  int32_t num_candidates = 0;              // K, in [1, kMaxSampleCandidates]
  CandidateRow* rows = nullptr;            // [num_rows], device
  int32_t* ids = nullptr;                  // [num_rows, K] the candidates' ids, ascending, device
  float* candidate_logits = nullptr;       // [num_rows, K] their logits, device
};

// One token's logit processing on the device (Backend::process_logits), in the host sampler's
// order (server/engine/sampling.cpp): + bias, then banned (-inf), then the repetition penalty (l > 0 ?
// l / r : l * r), then minus the frequency and presence penalties. `subtract` is computed on the
// host (frequency * count + presence, in the host's own expression), so the device does one
// rounded operation per step, as the host, and no contraction into an FMA can differ.
struct LogitEdit {
  static constexpr uint32_t kBias = 1, kBan = 2, kRepetition = 4, kSubtract = 8;
  int32_t token = 0;
  uint32_t ops = 0;  // which of the four apply
  float bias = 0.0f;
  float repetition = 1.0f;
  float subtract = 0.0f;
};

// nvcc contracts a product and a following difference into one FMA (one rounding, not the
// host's two) even across statements: the device spells each rounded operation out.
#if defined(__CUDA_ARCH__)
#define SAMPLING_OP(device, expr) device
#else
#define SAMPLING_OP(device, expr) expr
#endif
SAMPLING_HD float apply_logit_edit(float l, const LogitEdit& e) {
  if (e.ops & LogitEdit::kBias) l = SAMPLING_OP(__fadd_rn(l, e.bias), l + e.bias);
  if (e.ops & LogitEdit::kBan) l = -INFINITY;
  if (e.ops & LogitEdit::kRepetition)
    l = l > 0 ? SAMPLING_OP(__fdiv_rn(l, e.repetition), l / e.repetition) : SAMPLING_OP(__fmul_rn(l, e.repetition), l * e.repetition);
  if (e.ops & LogitEdit::kSubtract) l = SAMPLING_OP(__fsub_rn(l, e.subtract), l - e.subtract);
  return l;
}
#undef SAMPLING_OP

struct LogitProcessParams {
  float* logits = nullptr;             // [num_rows, vocab_size] fp32, device, processed in place
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  // Rows with an allow mask first set every token whose bit is clear to -inf (allowed_token_ids;
  // bit t of a row is word t / 32, bit t % 32), then apply their edits.
  const int32_t* mask_index = nullptr;  // [num_rows] the row's mask in `masks`, or -1, device
  const uint32_t* masks = nullptr;      // [*, mask_words], device
  int64_t mask_words = 0;               // ceil(vocab_size / 32)
  const int32_t* edit_begin = nullptr;  // [num_rows + 1] row r's edits: [edit_begin[r], edit_begin[r + 1]), device
  const LogitEdit* edits = nullptr;     // at most one per token of a row, device
};

}  // namespace fp8serve
