#pragma once
// Sampling arithmetic shared by the host sampler (server/engine/sampling.cpp) and the device's sampling
// kernels (kernels/cuda/sampling.cu), so that both compute the same bits:
//
//   - ExpSum: the sum of a row's exp(l - max) terms, which log-softmax (the reported logprobs)
//     needs. A sum of floats depends on the order of its additions, and a device reduces in an
//     order a host loop cannot follow cheaply. So each term (in [0, 1]) is truncated to a fixed
//     point of 2^-42 and the integers are added: integer addition is associative, so the sum is
//     exact and the same in any order, on any number of threads. It differs from the real sum of
//     the terms by less than vocab * 2^-42 (2^-25 at 128k ids), below a float's precision at a
//     sum >= 1 (the maximum's own term); up to 2^20 terms fit in 63 bits.
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
  // value = bits * 2^-42. A term that is not in [0, 1] (NaN: an inf - inf or a NaN logit) makes the
  // sum NaN, as it would make a float sum NaN: it sets the top bit (kNaN) for good. The terms of a
  // row (at most kMaxTerms, each at most 2^42) never reach that bit, adding to a marked sum keeps
  // it, and merge() leaves a marked sum exactly kNaN.
  uint64_t bits = 0;
  static constexpr int64_t kMaxTerms = int64_t{1} << 20;  // a vocabulary's limit (model_config.cpp)
  static constexpr uint64_t kNaN = uint64_t{1} << 63;

  SAMPLING_HD bool is_nan() const { return bits >= kNaN; }
  // Adds one term (exp of a non-positive number: in [0, 1]), without branches: a device adds one
  // per logit.
  SAMPLING_HD void add(float term) { add_checked(term, term >= 0.0f && term <= 1.0f); }
  // The same, `in_range` said by the caller (add_exp knows it from its argument). term * 2^42 is
  // exact (a float >= 2^-116, < 2^43), and its conversion truncates: only the bits below 2^-42 go.
  // A signed conversion: one instruction on x86-64 and on a GPU.
  SAMPLING_HD void add_checked(float term, bool in_range) {
    const float scaled = (in_range ? term : 0.0f) * 0x1.0p42f;
    bits += static_cast<uint64_t>(static_cast<int64_t>(scaled));
    bits |= in_range ? 0 : kNaN;
  }
  SAMPLING_HD void merge(const ExpSum& other) { bits = ((bits | other.bits) & kNaN) ? kNaN : bits + other.bits; }
  // The sum as a double (the integer rounded once to 53 bits, the same way everywhere).
  SAMPLING_HD double value() const {
    if (is_nan()) return NAN;
    return static_cast<double>(bits) * 0x1.0p-42;
  }
};

// IEEE float operations rounded each on its own: nvcc would contract a product and a sum into one
// FMA, the host build does not (CMakeLists.txt: -ffp-contract=off).
#if defined(__CUDA_ARCH__)
SAMPLING_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
SAMPLING_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
SAMPLING_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
#else
SAMPLING_HD float mul_rn(float a, float b) { return a * b; }
SAMPLING_HD float add_rn(float a, float b) { return a + b; }
SAMPLING_HD float sub_rn(float a, float b) { return a - b; }
#endif

// 2^(i / 32) for i = 0..31, each the nearest float (tests/unit/sampling/test_sampling_arith.cpp
// checks them against exp2l). A device kernel copies it to shared memory (exp_nonpositive's table:
// 32 floats on 32 banks, so a warp's lookups take one wavefront).
struct Exp2Table {
  float at[32];
};
inline constexpr Exp2Table kExp2ThirtySeconds{{
    0x1p+0f,        0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f, 0x1.1d4874p+0f, 0x1.2387a6p+0f,
    0x1.29e9e0p+0f, 0x1.306fe0p+0f, 0x1.371a74p+0f, 0x1.3dea64p+0f, 0x1.44e086p+0f, 0x1.4bfdaep+0f, 0x1.5342b6p+0f,
    0x1.5ab07ep+0f, 0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f, 0x1.7a1148p+0f, 0x1.82589ap+0f, 0x1.8ace54p+0f,
    0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f, 0x1.ae89fap+0f, 0x1.b7f770p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f,
    0x1.d5818ep+0f, 0x1.dfc974p+0f, 0x1.ea4afap+0f, 0x1.f50766p+0f,
}};

// exp_nonpositive's constants: ln2 / 32 in two parts (the first with 12 bits), and 1/6, the
// Taylor coefficient of r^3 (0.5 and 1 are immediates). A device kernel reads them from constant
// memory (operands of its instructions, no moves).
struct ExpCoefficients {
  float ln2_32_hi, ln2_32_lo, c3;
};
inline constexpr ExpCoefficients kExpCoefficients{0x1.62ep-6f, 0x1.0bfbe8p-20f, 0x1.555556p-3f};

// x brought into exp_core's domain [-80, 0]: a NaN gives -80, x > 0 gives 0 (the callers discard
// what exp_core makes of those; clamping keeps k a small integer: no float-to-int overflow).
SAMPLING_HD float in_exp_domain(float x) { return x > -80.0f ? (x < 0.0f ? x : 0.0f) : -80.0f; }

// exp(x) for x in [-80, 0]: see exp_nonpositive.
SAMPLING_HD float exp_core(float x, const float* table, const ExpCoefficients& c) {
  // k = rint(x * 32 / ln2) (only its nearness matters): adding 1.5 * 2^23 rounds the product to an
  // integer, which the sum's low mantissa bits hold (no conversion instruction; |k| < 2^22).
  const float shifted = add_rn(mul_rn(x, 0x1.715476p+5f), 0x1.8p23f);
  const float kf = sub_rn(shifted, 0x1.8p23f);
  uint32_t shifted_bits;
  memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  const int k = static_cast<int>(shifted_bits - 0x4b400000u);  // minus 1.5 * 2^23's bits
  float r = sub_rn(x, mul_rn(kf, c.ln2_32_hi));  // exact
  r = sub_rn(r, mul_rn(kf, c.ln2_32_lo));
  float p = add_rn(mul_rn(c.c3, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = mul_rn(p, r);  // exp(r) - 1
  const float t = table[k & 31];
  const float v = add_rn(t, mul_rn(t, p));  // 2^((k & 31) / 32) * exp(r), in [0.99, 2)
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  bits += static_cast<uint32_t>(k >> 5) << 23;  // k >> 5 in [-116, 0]
  float out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

// exp(x) for x <= 0, as the sampler defines it everywhere: the same IEEE float operations in the
// same order on the host and on a device, so the same bits (libm's and CUDA's expf() differ in
// their last bits), and no FP64: a device computes one or two for every logit of a row.
// Within 1.02 ulp of the true value (1.0135 at worst over every float of the domain; the test
// measures every 13th):
//   x = k ln2 / 32 + r, k = rint(x * 32 / ln2), |r| <= ~ln2 / 64; ln2 / 32 in two parts, the
//   first with 12 bits, so k times it (|k| < 2^12) and x minus that are exact;
//   exp(x) = 2^(k >> 5) * 2^((k & 31) / 32) * exp(r), exp(r) - 1 by its Taylor series to r^3 / 6
//   (the next term is < 2^-30 of the result), the power of two put into the exponent bits (exact:
//   x >= -80 keeps the result normal, >= 2^-116).
// Below -80 the result is 0: the true value is < 2^-115, nothing next to a sum that holds the
// maximum's term 1 (and below an ExpSum's 2^-42 anyway). NaN gives NaN; x > 0 (never asked: x is
// l - max) gives +inf, which an ExpSum counts as NaN.
SAMPLING_HD float exp_nonpositive(float x, const float* table, const ExpCoefficients& c) {
  const float v = exp_core(in_exp_domain(x), table, c);
  if (x <= 0.0f) return x < -80.0f ? 0.0f : v;
  return x > 0.0f ? INFINITY : NAN;
}

// sum.add(exp_nonpositive(x)) without its cases' branches, for a device's hot loop: the same bits.
// (x <= 0 is exactly when exp_nonpositive's result is in [0, 1]: NaN and x > 0 mark the sum.)
SAMPLING_HD void add_exp(ExpSum& sum, float x, const float* table, const ExpCoefficients& c) {
  const float v = exp_core(in_exp_domain(x), table, c);
  sum.add_checked(x < -80.0f ? 0.0f : v, x <= 0.0f);
}

// One term of the raw row's log-softmax: exp(l - max), the difference rounded in fp32 as the host
// has always computed it. (Host only: a device kernel calls exp_nonpositive with its shared table.)
inline float softmax_term(float logit, float max_logit) {
  return exp_nonpositive(logit - max_logit, kExp2ThirtySeconds.at, kExpCoefficients);
}

// One temperature-scaled weight relative to the maximum, exp((l - max) / T): the difference and
// the product by 1/T rounded in fp32, as the host's draw has always computed them.
inline float scaled_term(float logit, float max_logit, float inv_temperature) {
  return exp_nonpositive((logit - max_logit) * inv_temperature, kExp2ThirtySeconds.at, kExpCoefficients);
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
  ExpSum raw_sum;              // sum of exp(l - max): log-softmax of the raw row (0 unless wanted)
  ExpSum scaled_sum;           // sum of exp((l - max) / T): top-p's total over the whole row
};

struct CandidateSampleParams {
  const float* logits = nullptr;           // [num_rows, vocab_size] fp32, device
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  const float* inv_temperature = nullptr;  // [num_rows] 1/T in fp32 (as the host computes it), device
  // [num_rows] whether the row's raw_sum is wanted (its request asks for logprobs; nullptr: every
  // row's), device. A row that does not want it gets raw_sum 0 and one exp an id instead of two;
  // so does a row at 1/T = 1, whose two sums are one.
  const uint8_t* raw_sum_wanted = nullptr;
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
