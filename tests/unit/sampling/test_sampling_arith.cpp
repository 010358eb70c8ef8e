// The arithmetic the host sampler shares with the device's (kernels/sampling_ops.hpp): the
// fixed-point ExpSum against a long-double sum, in any order; sample_key's order against the
// host's argmax; which sequences may take a device's greedy pick.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "server/engine/sampling.hpp"

using namespace fp8serve;

TEST_CASE("ExpSum is exact to 2^-99 a term and the same in any order", "[sampling]") {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> row(128256);
  for (float& v : row) v = normal(rng);
  const float max_logit = *std::max_element(row.begin(), row.end());
  std::vector<double> terms;
  for (float l : row) terms.push_back(softmax_term(l, max_logit));

  long double exact = 0;
  for (double t : terms) exact += static_cast<long double>(t);
  ExpSum forward;
  for (double t : terms) forward.add(t);
  // Truncation loses < 2^-99 a term: far below a double's precision at a sum >= 1.
  CHECK(std::fabs(static_cast<long double>(forward.value()) - exact) <= exact * 0x1.0p-52L);

  for (int round = 0; round < 3; ++round) {
    std::shuffle(terms.begin(), terms.end(), rng);
    // Split into uneven partial sums merged in a different order, as a device's threads would.
    ExpSum a, b, c;
    for (std::size_t i = 0; i < terms.size(); ++i) (i % 3 == 0 ? a : i % 7 == 0 ? b : c).add(terms[i]);
    c.merge(a);
    c.merge(b);
    CHECK(c.hi == forward.hi);
    CHECK(c.lo == forward.lo);
  }
  // A term that is not in [0, 1] (exp of NaN, from inf - inf or a NaN logit) makes it NaN for good.
  ExpSum nan_sum = forward;
  nan_sum.add(std::numeric_limits<double>::quiet_NaN());
  nan_sum.add(0.5);
  CHECK(std::isnan(nan_sum.value()));
  for (int i = 0; i < 1000; ++i) nan_sum.add(1.0);  // the mark stays whatever follows
  CHECK(std::isnan(nan_sum.value()));
  ExpSum merged = forward;
  merged.merge(nan_sum);
  CHECK(std::isnan(merged.value()));
  CHECK((merged.hi == ExpSum::kNaN && merged.lo == 0));  // one NaN, whatever the order: the same bits
  ExpSum other_way = nan_sum;
  other_way.merge(forward);
  CHECK((other_way.hi == merged.hi && other_way.lo == merged.lo));
}

TEST_CASE("add_exp adds what add(exp_nonpositive) adds, its special cases included", "[sampling]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {0.0f, -0.0f, -1e-30f, -0.3f, -17.25f, -69.5f, -699.0f, -700.0f, -700.5f, -1e30f, -inf, 1e-30f, 2.0f,
                  inf, nan}) {
    ExpSum a, b;
    a.add(0.25);
    b.add(0.25);
    add_exp(a, x, kExp2Sixtyfourths.at, kExpCoefficients);
    b.add(exp_nonpositive(x, kExp2Sixtyfourths.at, kExpCoefficients));
    INFO("x " << x);
    CHECK((a.hi == b.hi && a.lo == b.lo));
    CHECK(std::isnan(a.value()) == !(x <= 0.0f));
  }
}

// The distance of `got` from `want` in units of the double's last place at `want`.
long double ulps(double got, long double want) {
  int e = 0;
  std::frexp(static_cast<double>(want), &e);
  return std::fabs(static_cast<long double>(got) - want) / std::ldexp(1.0L, e - 53);
}

TEST_CASE("exp_nonpositive: its table is the nearest doubles, its result within 1 ulp of expl", "[sampling]") {
  for (int i = 0; i < 64; ++i) {
    INFO("2^(" << i << "/64)");
    CHECK(ulps(kExp2Sixtyfourths.at[i], std::exp2l(i / 64.0L)) <= 0.5L);
  }
  // Every fp32 step over [-2, 0] at a coarse stride, then a random sweep down to -700, then the edges.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> wide(-700.0f, 0.0f);
  std::vector<float> xs;
  for (float x = 0.0f; x > -2.0f; x = std::nextafter(x, -3.0f) - 1e-4f) xs.push_back(x);
  for (int i = 0; i < 200000; ++i) xs.push_back(wide(rng));
  for (float x : {-0.0f, -1e-30f, -1e-45f, -0.00541521f, -0.00541522f, -69.3f, -699.99f, -700.0f}) xs.push_back(x);
  long double worst = 0;
  for (float x : xs) {
    const double got = exp_nonpositive(x, kExp2Sixtyfourths.at, kExpCoefficients);
    const long double want = std::exp(static_cast<long double>(x));
    INFO("x " << x);
    REQUIRE(std::isnormal(got));
    worst = std::max(worst, ulps(got, want));
  }
  INFO("worst " << static_cast<double>(worst) << " ulp");
  CHECK(worst <= 1.0L);
  CHECK(exp_nonpositive(0.0f, kExp2Sixtyfourths.at, kExpCoefficients) == 1.0);  // the maximum's own term: exactly 1
  CHECK(exp_nonpositive(-700.5f, kExp2Sixtyfourths.at, kExpCoefficients) == 0.0);
  CHECK(exp_nonpositive(-std::numeric_limits<float>::infinity(), kExp2Sixtyfourths.at, kExpCoefficients) == 0.0);
  CHECK(std::isnan(exp_nonpositive(std::numeric_limits<float>::quiet_NaN(), kExp2Sixtyfourths.at, kExpCoefficients)));
  CHECK(exp_nonpositive(0.5f, kExp2Sixtyfourths.at, kExpCoefficients) > 1.0);  // never asked; an ExpSum takes it as NaN
}

TEST_CASE("ExpSum::add keeps exactly floor(term * 2^99)", "[sampling]") {
  std::mt19937_64 rng(5);
  std::vector<double> terms{0.0, 1.0, 0x1.0p-99, 0x1.8p-99, 0x1.fffffffffffffp-100, 0x1.0p-63, 0x1.0p-36,
                            0x1.fffffffffffffp-1, 0x1.0p-1074, 0x1.0p-1022, 0.5};
  std::uniform_real_distribution<double> expo(-110.0, 0.0);
  for (int i = 0; i < 20000; ++i) terms.push_back(std::exp2(expo(rng)));
  ExpSum all;
  __extension__ typedef unsigned __int128 u128;
  u128 exact = 0;  // the running sum, in an independent 128-bit integer
  for (double t : terms) {
    // t * 2^99 is exact in a long double (a 64-bit significand); its floor's halves are exact too.
    const long double v = std::floor(std::ldexp(static_cast<long double>(t), 99));
    const long double hi = std::floor(std::ldexp(v, -63));
    const long double lo = v - std::ldexp(hi, 63);
    ExpSum s;
    s.add(t);
    INFO("term " << t);
    CHECK(s.hi == static_cast<uint64_t>(hi));
    CHECK(s.lo == static_cast<uint64_t>(lo));
    all.add(t);
    exact += static_cast<u128>(v);
  }
  // and the running sum's carries between the halves: the total's halves exactly
  CHECK(all.hi == static_cast<uint64_t>(exact >> 63));
  CHECK(all.lo == static_cast<uint64_t>(exact & ((static_cast<u128>(1) << 63) - 1)));
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
