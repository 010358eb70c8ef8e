// The arithmetic the host sampler shares with the device's (kernels/sampling_ops.hpp): the
// fixed-point ExpSum against a long-double sum, in any order; exp_nonpositive against libm; sample_key's
// order against the host's argmax; which sequences may take a device's greedy pick.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "server/engine/sampling.hpp"

using namespace fp8serve;

TEST_CASE("ExpSum is exact to 2^-42 a term and the same in any order", "[sampling]") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> row(128256);
  for (float& v : row) v = normal(rng);
  const float max_logit = *std::max_element(row.begin(), row.end());
  std::vector<float> terms;
  for (float l : row) terms.push_back(softmax_term(l, max_logit));

  long double exact = 0;
  for (float t : terms) exact += static_cast<long double>(t);
  ExpSum forward;
  for (float t : terms) forward.add(t);
  // Truncation loses < 2^-42 a term: < 2^-25 over the row, below a float's precision at a sum >= 1.
  CHECK(exact >= 1.0L);
  CHECK(static_cast<long double>(forward.value()) <= exact);
  CHECK(exact - static_cast<long double>(forward.value()) < std::ldexp(static_cast<long double>(terms.size()), -42));

  for (int round = 0; round < 3; ++round) {
    std::shuffle(terms.begin(), terms.end(), rng);
    // Split into uneven partial sums merged in a different order, as a device's threads would.
    ExpSum a, b, c;
    for (std::size_t i = 0; i < terms.size(); ++i) (i % 3 == 0 ? a : i % 7 == 0 ? b : c).add(terms[i]);
    c.merge(a);
    c.merge(b);
    CHECK(c.bits == forward.bits);
  }
  // A term that is not in [0, 1] (exp of NaN, from inf - inf or a NaN logit) makes it NaN for good.
  ExpSum nan_sum = forward;
  nan_sum.add(std::numeric_limits<float>::quiet_NaN());
  nan_sum.add(0.5f);
  CHECK(std::isnan(nan_sum.value()));
  for (int i = 0; i < 1000; ++i) nan_sum.add(1.0f);  // the mark stays whatever follows
  CHECK(std::isnan(nan_sum.value()));
  ExpSum merged = forward;
  merged.merge(nan_sum);
  CHECK(std::isnan(merged.value()));
  CHECK(merged.bits == ExpSum::kNaN);  // one NaN, whatever the order: the same bits
  ExpSum other_way = nan_sum;
  other_way.merge(forward);
  CHECK(other_way.bits == merged.bits);
  // The most a row can hold: kMaxTerms terms of 1 (a row of equal logits) stays below the mark.
  ExpSum full;
  for (int64_t i = 0; i < ExpSum::kMaxTerms; ++i) full.add(1.0f);
  CHECK_FALSE(full.is_nan());
  CHECK(full.value() == static_cast<double>(ExpSum::kMaxTerms));
}

TEST_CASE("add_exp adds what add(exp_nonpositive) adds, its special cases included", "[sampling]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {0.0f, -0.0f, -1e-30f, -0.3f, -17.25f, -69.5f, -79.0f, -80.0f, -80.5f, -1e30f, -inf, 1e-30f, 2.0f,
                  inf, nan}) {
    ExpSum a, b;
    a.add(0.25f);
    b.add(0.25f);
    add_exp(a, x, kExp2ThirtySeconds.at, kExpCoefficients);
    b.add(exp_nonpositive(x, kExp2ThirtySeconds.at, kExpCoefficients));
    INFO("x " << x);
    CHECK(a.bits == b.bits);
    CHECK(std::isnan(a.value()) == !(x <= 0.0f));
  }
}

// The distance of `got` from `want` in units of the float's last place at `want`.
double ulps(float got, double want) {
  int e = 0;
  std::frexp(want, &e);
  return std::fabs(static_cast<double>(got) - want) / std::ldexp(1.0, e - 24);
}

TEST_CASE("exp_nonpositive: its table is the nearest floats, its result within 1.02 ulp of exp", "[sampling]") {
  for (int i = 0; i < 32; ++i) {
    INFO("2^(" << i << "/32)");
    CHECK(ulps(kExp2ThirtySeconds.at[i], static_cast<double>(std::exp2l(i / 32.0L))) <= 0.5);
  }
  // Every 13th float of the domain [-80, 0] (86 million of its 2^30; all of them, once: 1.0135 ulp
  // at -7.55179), against libm's exp in double (exact far below a float's last place).
  double worst = 0;
  float worst_x = 0;
  auto next = [](float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits += 13;  // -0 is 0x80000000: upward in the bits is downward in value
    std::memcpy(&x, &bits, sizeof x);
    return x;
  };
  for (float x = -0.0f; x >= -80.0f; x = next(x)) {
    const float got = exp_nonpositive(x, kExp2ThirtySeconds.at, kExpCoefficients);
    const double u = ulps(got, std::exp(static_cast<double>(x)));
    if (u > worst) worst = u, worst_x = x;
  }
  INFO("worst " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 1.02);
  CHECK(std::isnormal(exp_nonpositive(-80.0f, kExp2ThirtySeconds.at, kExpCoefficients)));
  CHECK(exp_nonpositive(0.0f, kExp2ThirtySeconds.at, kExpCoefficients) == 1.0f);  // the maximum's own term: exactly 1
  CHECK(exp_nonpositive(-80.5f, kExp2ThirtySeconds.at, kExpCoefficients) == 0.0f);
  CHECK(exp_nonpositive(-std::numeric_limits<float>::infinity(), kExp2ThirtySeconds.at, kExpCoefficients) == 0.0f);
  CHECK(std::isnan(exp_nonpositive(std::numeric_limits<float>::quiet_NaN(), kExp2ThirtySeconds.at, kExpCoefficients)));
  CHECK(exp_nonpositive(0.5f, kExp2ThirtySeconds.at, kExpCoefficients) > 1.0f);  // never asked; an ExpSum takes it as NaN
}

TEST_CASE("ExpSum::add keeps exactly floor(term * 2^42)", "[sampling]") {
  std::mt19937_64 rng(5);
  std::vector<float> terms{0.0f, 1.0f, 0x1.0p-42f, 0x1.8p-42f, 0x1.fffffep-43f, 0x1.0p-20f, 0x1.fffffep-1f,
                           0x1.0p-116f, 0x1.0p-126f, 0.5f, 0x1.800002p-19f};
  std::uniform_real_distribution<float> expo(-50.0f, 0.0f);
  for (int i = 0; i < 20000; ++i) terms.push_back(std::exp2(expo(rng)));
  ExpSum all;
  uint64_t exact = 0;  // the running sum, computed independently in long double then integers
  for (float t : terms) {
    const long double v = std::floor(std::ldexp(static_cast<long double>(t), 42));  // exact: t has 24 bits
    ExpSum s;
    s.add(t);
    INFO("term " << t);
    CHECK(s.bits == static_cast<uint64_t>(v));
    all.add(t);
    exact += static_cast<uint64_t>(v);
  }
  CHECK(all.bits == exact);
  CHECK(all.value() == std::ldexp(static_cast<double>(exact), -42));
}

TEST_CASE("sample_key orders as the host's argmax: highest logit, lowest id, -0 == +0, NaN last but at id 0",
          "[sampling]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(sample_key(2.0f, 5) > sample_key(1.0f, 0));
  CHECK(sample_key(-1.0f, 5) > sample_key(-2.0f, 0));
  CHECK(sample_key(1.0f, 3) > sample_key(1.0f, 4));       // tie: lower id
  CHECK(sample_key(-0.0f, 3) > sample_key(0.0f, 4));      // -0 ties with +0
  CHECK(sample_key(-inf, 9) > sample_key(nan, 1));        // NaN is never chosen...
  CHECK(sample_key(nan, 0) > sample_key(inf, 1));         // ...except at id 0
  CHECK(sample_key(inf, 1) > sample_key(3e38f, 0));
  for (const int32_t id : {0, 1, 77, 151935}) CHECK(sample_key_id(sample_key(0.5f, id)) == id);
}

TEST_CASE("greedy_on_raw_logits: only when nothing but the raw argmax and its logprob is asked", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.0f;
  CHECK(Sampler(p, {}, 1).greedy_on_raw_logits());
  p.num_logprobs = 0;
  CHECK(Sampler(p, {}, 1).greedy_on_raw_logits());
  auto refused = [&](auto change) {
    SamplingParams q = p;
    change(q);
    return !Sampler(q, {}, 1).greedy_on_raw_logits();
  };
  CHECK(refused([](SamplingParams& q) { q.temperature = 0.7f; }));
  CHECK(refused([](SamplingParams& q) { q.num_logprobs = 2; }));
  CHECK(refused([](SamplingParams& q) { q.logit_bias = {{3, 1.0f}}; }));
  CHECK(refused([](SamplingParams& q) { q.allowed_token_ids = {1, 2}; }));
  CHECK(refused([](SamplingParams& q) { q.repetition_penalty = 1.1f; }));
  CHECK(refused([](SamplingParams& q) { q.frequency_penalty = 0.5f; }));
  CHECK(refused([](SamplingParams& q) { q.presence_penalty = -0.5f; }));
  // min_tokens bans ids only until that many tokens were generated.
  SamplingParams m = p;
  m.min_tokens = 1;
  m.min_tokens_banned = {2};
  Sampler s(m, {}, 1);
  CHECK_FALSE(s.greedy_on_raw_logits());
  std::vector<float> row{0.0f, 1.0f, 5.0f};
  CHECK(s.sample(row).token == 1);
  CHECK(s.greedy_on_raw_logits());
}

TEST_CASE("processors run on the device only for rows that ask no logprobs (those are of the raw row)", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{3, 1.0f}};
  CHECK(Sampler(p, {}, 1).processed_on_device());
  CHECK(Sampler(p, {}, 1).greedy_on_device());
  CHECK(Sampler(p, {}, 1).candidates_on_device(kMaxSampleCandidates));
  p.num_logprobs = 0;  // logprobs of the raw row: processing in place would lose it
  CHECK_FALSE(Sampler(p, {}, 1).processed_on_device());
  CHECK_FALSE(Sampler(p, {}, 1).greedy_on_device());
  CHECK_FALSE(Sampler(p, {}, 1).candidates_on_device(kMaxSampleCandidates));
  p.logit_bias.clear();  // nothing acts: the raw row's device paths, logprobs allowed
  CHECK_FALSE(Sampler(p, {}, 1).processed_on_device());
  CHECK(Sampler(p, {}, 1).greedy_on_device());
  p.temperature = 0.8f;
  p.num_logprobs = -1;
  p.frequency_penalty = 0.5f;
  CHECK_FALSE(Sampler(p, {}, 1).greedy_on_device());
  CHECK(Sampler(p, {}, 1).candidates_on_device(kMaxSampleCandidates));
}

TEST_CASE("accept_greedy reports what sample() would for the same row", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.num_logprobs = 0;
  const std::vector<float> row{0.5f, 3.0f, -1.0f, 3.0f, 2.0f};
  GreedyRow pick;
  pick.token = 1;
  pick.max_logit = 3.0f;
  for (float l : row) pick.sum.add(softmax_term(l, pick.max_logit));
  Sampler host(p, {}, 1), device(p, {}, 1);
  std::vector<float> scratch = row;
  const SampleResult want = host.sample(scratch);
  const SampleResult got = device.accept_greedy(pick);
  CHECK(got.token == want.token);
  CHECK(got.logprob == want.logprob);
  // An independent reference: log-softmax in double.
  CHECK(got.logprob == Approx(-std::log(std::exp(0.5 - 3.0) + 2 + std::exp(-4.0) + std::exp(-1.0))));
}
