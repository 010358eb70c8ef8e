#pragma once
// Sampling arithmetic shared by the host sampler (server/engine/sampling.cpp) and the device's sampling
// kernels (kernels/cuda/sampling.cu), so that both compute the same bits:
//
//   - ExpSum: the sum of a row's exp(l - max) terms, which log-softmax (the reported logprobs)
//     needs. A sum of doubles depends on the order of its additions, and a device reduces in an
//     order a host loop cannot follow cheaply. So each term (in [0, 1]) is truncated to a fixed
//     point of 2^-99 and the integers are added: integer addition is associative, so the sum is
//     exact and the same in any order, on any number of threads. 2^-99 is far below a double's
//     precision at the sum (>= 1: the maximum's own term), and 2^17 terms of at most 2^99 fit
//     the 126 bits kept, so the value differs from an exact real sum by < vocab * 2^-99.
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
  // value = (hi * 2^63 + lo) * 2^-99, lo < 2^63. A term that is not in [0, 1] (NaN: an inf - inf or
  // a NaN logit) makes the sum NaN, as it makes the host's double sum NaN: it sets hi's top bit
  // (kNaN) for good. A row's terms (< 2^17 of them, each <= 2^36 in hi) never reach that bit,
  // adding to a marked sum keeps it, and merge() leaves a marked sum exactly {kNaN, 0}.
  uint64_t hi = 0;
  uint64_t lo = 0;
  static constexpr uint64_t kNaN = uint64_t{1} << 63;
  static constexpr uint64_t kLow = (uint64_t{1} << 63) - 1;  // lo's bits

  SAMPLING_HD bool is_nan() const { return hi >= kNaN; }
  // Adds one term (exp of a non-positive number: in [0, 1]), without branches: a device adds one
  // per logit.
  SAMPLING_HD void add(double term) { add_checked(term, term >= 0.0 && term <= 1.0); }
  // The same, `in_range` said by the caller (add_exp knows it from the exponent). term * 2^36 is
  // exact; its integer part and fraction split exactly; the fraction times 2^63 is exact and its
  // truncation drops only the bits below 2^-99. Signed conversions only: one instruction each on
  // x86-64 and on a GPU (an unsigned 64-bit one is a sequence on x86-64).
  SAMPLING_HD void add_checked(double term, bool in_range) {
    const double scaled = (in_range ? term : 0.0) * 0x1.0p36;
    const auto whole = static_cast<int64_t>(scaled);  // truncation: the floor of a number >= 0
    const auto part = static_cast<int64_t>((scaled - static_cast<double>(whole)) * 0x1.0p63);
    const uint64_t low = lo + static_cast<uint64_t>(part);
    hi += static_cast<uint64_t>(whole) + (low >> 63);
    hi |= in_range ? 0 : kNaN;
    lo = low & kLow;
  }
  SAMPLING_HD void merge(const ExpSum& other) {
    if (is_nan() || other.is_nan()) {
      hi = kNaN;
      lo = 0;
      return;
    }
    const uint64_t low = lo + other.lo;
    hi += other.hi + (low >> 63);
    lo = low & kLow;
  }
  // The sum as a double (rounded once from the exact value's two halves, the same way everywhere).
  SAMPLING_HD double value() const {
    if (is_nan()) return NAN;
    return (static_cast<double>(hi) + static_cast<double>(lo) * 0x1.0p-63) * 0x1.0p-36;
  }
};

// IEEE double operations rounded each on its own: nvcc would contract a product and a sum into one
// FMA, the host build does not (CMakeLists.txt: -ffp-contract=off).
#if defined(__CUDA_ARCH__)
SAMPLING_HD double mul_rn(double a, double b) { return __dmul_rn(a, b); }
SAMPLING_HD double add_rn(double a, double b) { return __dadd_rn(a, b); }
SAMPLING_HD double sub_rn(double a, double b) { return __dsub_rn(a, b); }
#else
SAMPLING_HD double mul_rn(double a, double b) { return a * b; }
SAMPLING_HD double add_rn(double a, double b) { return a + b; }
SAMPLING_HD double sub_rn(double a, double b) { return a - b; }
#endif

// 2^(i / 64) for i = 0..63, each the nearest double (tests/unit/sampling/test_sampling_arith.cpp
// checks them against exp2l). A device kernel copies it to shared memory (exp_nonpositive's table).
struct Exp2Table {
  double at[64];
};
inline constexpr Exp2Table kExp2Sixtyfourths{{
    0x1.0000000000000p+0, 0x1.02c9a3e778061p+0, 0x1.059b0d3158574p+0, 0x1.0874518759bc8p+0,
    0x1.0b5586cf9890fp+0, 0x1.0e3ec32d3d1a2p+0, 0x1.11301d0125b51p+0, 0x1.1429aaea92de0p+0,
    0x1.172b83c7d517bp+0, 0x1.1a35beb6fcb75p+0, 0x1.1d4873168b9aap+0, 0x1.2063b88628cd6p+0,
    0x1.2387a6e756238p+0, 0x1.26b4565e27cddp+0, 0x1.29e9df51fdee1p+0, 0x1.2d285a6e4030bp+0,
    0x1.306fe0a31b715p+0, 0x1.33c08b26416ffp+0, 0x1.371a7373aa9cbp+0, 0x1.3a7db34e59ff7p+0,
    0x1.3dea64c123422p+0, 0x1.4160a21f72e2ap+0, 0x1.44e086061892dp+0, 0x1.486a2b5c13cd0p+0,
    0x1.4bfdad5362a27p+0, 0x1.4f9b2769d2ca7p+0, 0x1.5342b569d4f82p+0, 0x1.56f4736b527dap+0,
    0x1.5ab07dd485429p+0, 0x1.5e76f15ad2148p+0, 0x1.6247eb03a5585p+0, 0x1.6623882552225p+0,
    0x1.6a09e667f3bcdp+0, 0x1.6dfb23c651a2fp+0, 0x1.71f75e8ec5f74p+0, 0x1.75feb564267c9p+0,
    0x1.7a11473eb0187p+0, 0x1.7e2f336cf4e62p+0, 0x1.82589994cce13p+0, 0x1.868d99b4492edp+0,
    0x1.8ace5422aa0dbp+0, 0x1.8f1ae99157736p+0, 0x1.93737b0cdc5e5p+0, 0x1.97d829fde4e50p+0,
    0x1.9c49182a3f090p+0, 0x1.a0c667b5de565p+0, 0x1.a5503b23e255dp+0, 0x1.a9e6b5579fdbfp+0,
    0x1.ae89f995ad3adp+0, 0x1.b33a2b84f15fbp+0, 0x1.b7f76f2fb5e47p+0, 0x1.bcc1e904bc1d2p+0,
    0x1.c199bdd85529cp+0, 0x1.c67f12e57d14bp+0, 0x1.cb720dcef9069p+0, 0x1.d072d4a07897cp+0,
    0x1.d5818dcfba487p+0, 0x1.da9e603db3285p+0, 0x1.dfc97337b9b5fp+0, 0x1.e502ee78b3ff6p+0,
    0x1.ea4afa2a490dap+0, 0x1.efa1bee615a27p+0, 0x1.f50765b6e4540p+0, 0x1.fa7c1819e90d8p+0,
}};

// exp_nonpositive's constants: ln2 / 64 in two parts (the first with 37 bits), then the Taylor
// coefficients of exp(r) - 1 from r^6 down to r^3 (0.5 and 1 are immediates). A device kernel reads
// them from constant memory (operands of its FP64 instructions, no moves).
struct ExpCoefficients {
  double ln2_64_hi, ln2_64_lo, c6, c5, c4, c3;
};
inline constexpr ExpCoefficients kExpCoefficients{0x1.62e42fefa0000p-7, 0x1.cf79abc9e3b3ap-46, 1.0 / 720, 1.0 / 120,
                                                  1.0 / 24, 1.0 / 6};

// The nearest integer to t (ties to even), |t| < 2^22: the device's rint; on the host the sum with
// 1.5 * 2^23 rounds it, the same value without a libm call (x86-64's baseline has no roundss).
SAMPLING_HD float nearest(float t) {
#if defined(__CUDA_ARCH__)
  return ::rintf(t);
#else
  return (t + 0x1.8p23f) - 0x1.8p23f;
#endif
}
// x brought into exp_core's domain [-700, 0]: a NaN gives -700, x > 0 gives 0 (the callers discard
// what exp_core makes of those; clamping keeps k a small integer: no float-to-int overflow).
SAMPLING_HD float in_exp_domain(float x) { return x > -700.0f ? (x < 0.0f ? x : 0.0f) : -700.0f; }

// exp(x) for x in [-700, 0]: see exp_nonpositive.
SAMPLING_HD double exp_core(float x, const double* table, const ExpCoefficients& c) {
  const int k = static_cast<int>(nearest(x * 92.33248f));  // 64 / ln2, in fp32: only k's nearness matters
  const double kd = static_cast<double>(k);
  double r = sub_rn(static_cast<double>(x), mul_rn(kd, c.ln2_64_hi));  // exact
  r = sub_rn(r, mul_rn(kd, c.ln2_64_lo));
  double q = add_rn(mul_rn(c.c6, r), c.c5);
  q = add_rn(mul_rn(q, r), c.c4);
  q = add_rn(mul_rn(q, r), c.c3);
  q = add_rn(mul_rn(q, r), 0.5);
  q = add_rn(mul_rn(q, r), 1.0);
  const double t = table[k & 63];
  const double v = add_rn(t, mul_rn(t, mul_rn(q, r)));  // 2^((k & 63) / 64) * exp(r), in [0.99, 2)
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  bits += static_cast<uint64_t>(static_cast<int64_t>(k >> 6)) << 52;  // k >> 6 in [-1010, 0]
  double out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

// exp(x) for x <= 0, as the sampler defines it everywhere: the same IEEE operations in the same order
// on the host and on a device, so the same bits (libm's and CUDA's exp() differ by up to 1 ulp).
// Within 1 ulp of the true value (the test measures it against a long double exp):
//   x = k ln2 / 64 + r, k = rint(x * 64 / ln2), |r| <= ~ln2 / 128; ln2 / 64 in two parts, the
//   first with 37 bits, so k times it (|k| < 2^16) and x minus that are exact;
//   exp(x) = 2^(k >> 6) * 2^((k & 63) / 64) * exp(r), exp(r) - 1 by its Taylor series to r^6 / 720
//   (the next term is < 2^-64 of the result), the power of two put into the exponent bits (exact:
//   x >= -700 keeps the result normal).
// Below -700 the result is 0: the true value is < 2^-1009, nothing next to a sum that holds the
// maximum's term 1 (and below an ExpSum's 2^-99 anyway). NaN gives NaN; x > 0 (never asked: x is
// l - max) gives +inf, which an ExpSum counts as NaN.
SAMPLING_HD double exp_nonpositive(float x, const double* table, const ExpCoefficients& c) {
  const double v = exp_core(in_exp_domain(x), table, c);
  if (x <= 0.0f) return x < -700.0f ? 0.0 : v;
  return x > 0.0f ? static_cast<double>(INFINITY) : static_cast<double>(NAN);
}

// sum.add(exp_nonpositive(x)) without its cases' branches, for a device's hot loop: the same bits.
// (x <= 0 is exactly when exp_nonpositive's result is in [0, 1]: NaN and x > 0 mark the sum.)
SAMPLING_HD void add_exp(ExpSum& sum, float x, const double* table, const ExpCoefficients& c) {
  const double v = exp_core(in_exp_domain(x), table, c);
  sum.add_checked(x < -700.0f ? 0.0 : v, x <= 0.0f);
}

// One term of the raw row's log-softmax: exp(l - max), the difference rounded in fp32 as the host
// has always computed it. (Host only: a device kernel calls exp_nonpositive with its shared table.)
inline double softmax_term(float logit, float max_logit) {
  return exp_nonpositive(logit - max_logit, kExp2Sixtyfourths.at, kExpCoefficients);
}

// One temperature-scaled weight relative to the maximum, exp((l - max) / T): the difference and
// the product by 1/T rounded in fp32, as the host's draw has always computed them.
inline double scaled_term(float logit, float max_logit, float inv_temperature) {
  return exp_nonpositive((logit - max_logit) * inv_temperature, kExp2Sixtyfourths.at, kExpCoefficients);
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
  int32_t slices = 0;             // CTAs a row is cut into: 0 chooses from the shape (tests set it)
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
  int32_t slices = 0;                      // CTAs a row is cut into: 0 chooses from the shape (tests set it)
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
