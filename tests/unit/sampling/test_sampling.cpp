// The sampler against plain reference computations of each rule (written here as the textbook
// formula over a sorted copy), and statistically against the distribution it must draw from.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "server/engine/sampling.hpp"

using namespace fp8serve;

namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.5f, 0.5f, -4.0f, 1.5f, 2.0f};

// Reference: probabilities after temperature, restricted by top-k, top-p, min-p — each step the
// plain definition over a fully sorted list.
std::map<int32_t, double> reference_distribution(std::vector<float> logits, const SamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> w(n);
  for (int i = 0; i < n; ++i) w[i] = std::exp(static_cast<double>(logits[i]) / p.temperature);
  size_t keep = ids.size();
  if (p.top_k > 0) keep = std::min(keep, static_cast<size_t>(p.top_k));
  if (p.top_p < 1.0f) {
    double total = 0;
    for (size_t i = 0; i < keep; ++i) total += w[ids[i]];
    double acc = 0;
    size_t k = 0;
    while (k < keep && acc < p.top_p * total) acc += w[ids[k++]];
    keep = k;
  }
  std::map<int32_t, double> dist;
  const double best = w[ids[0]];
  for (size_t i = 0; i < keep; ++i)
    if (w[ids[i]] >= p.min_p * best) dist[ids[i]] = w[ids[i]];
  double total = 0;
  for (auto& [id, v] : dist) total += v;
  for (auto& [id, v] : dist) v /= total;
  return dist;
}

std::map<int32_t, double> empirical(const SamplingParams& p, int draws) {
  Sampler sampler(p, {}, 1234);
  std::map<int32_t, double> freq;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> row = kLogits;
    // A fresh sampler would repeat its first draw; one sampler with no penalties draws i.i.d.
    freq[sampler.sample(row).token] += 1.0 / draws;
  }
  return freq;
}

void check_matches(const SamplingParams& p) {
  const int draws = 40000;
  const auto want = reference_distribution(kLogits, p);
  const auto got = empirical(p, draws);
  // Nothing outside the allowed set is ever drawn; everything likely enough to be seen is seen.
  for (auto& [id, v] : got) {
    INFO("drew token " << id);
    CHECK(want.count(id) == 1);
  }
  for (auto& [id, prob] : want)
    if (prob * draws > 20) CHECK(got.count(id) == 1);
  for (auto& [id, prob] : want) {
    const double sigma = std::sqrt(prob * (1 - prob) / draws);
    INFO("token " << id << " want " << prob << " got " << (got.count(id) ? got.at(id) : 0.0));
    CHECK(std::abs((got.count(id) ? got.at(id) : 0.0) - prob) <= 5 * sigma + 1e-9);
  }
}

}  // namespace

TEST_CASE("greedy picks the argmax, lowest id on ties", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {}, 1);
  std::vector<float> row = kLogits;
  CHECK(s.sample(row).token == 1);
  std::vector<float> tie = {0.f, 5.f, 5.f, 1.f};
  CHECK(s.sample(tie).token == 1);
}

TEST_CASE("draws follow the filtered distribution", "[sampling]") {
  SamplingParams p;
  SECTION("temperature only") { p.temperature = 0.7f; }
  SECTION("top-k") { p.top_k = 3; }
  SECTION("top-p") { p.top_p = 0.6f; }
  SECTION("top-p with ties at the edge") { p.top_p = 0.45f; }
  SECTION("min-p") { p.min_p = 0.2f; }
  SECTION("all together") {
    p.temperature = 1.3f;
    p.top_k = 6;
    p.top_p = 0.9f;
    p.min_p = 0.05f;
  }
  check_matches(p);
}

TEST_CASE("a seed makes the draws reproducible; different seeds differ", "[sampling]") {
  auto run = [](std::optional<uint64_t> seed, uint64_t fallback) {
    SamplingParams p;
    p.seed = seed;
    Sampler s(p, {}, fallback);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      std::vector<float> row = kLogits;
      out.push_back(s.sample(row).token);
    }
    return out;
  };
  CHECK(run(42, 1) == run(42, 2));  // the request's seed wins over the engine's fallback
  CHECK(run(42, 1) != run(43, 1));
  CHECK(run(std::nullopt, 5) != run(std::nullopt, 6));
}

TEST_CASE("penalties follow vLLM's formulas", "[sampling]") {
  // Greedy makes the effect visible: the penalized logits decide the argmax.
  SamplingParams p;
  p.temperature = 0;
  SECTION("repetition penalty divides positive and multiplies negative logits of seen tokens") {
    p.repetition_penalty = 2.0f;
    const std::vector<int32_t> prompt = {1, 3};
    Sampler s(p, prompt, 0);
    // token 1: 3.0 -> 1.5, so 2 and 5 (2.5) win; lowest id 2.
    std::vector<float> row = kLogits;
    CHECK(s.sample(row).token == 2);
    CHECK(row[1] == 1.5f);
    CHECK(row[3] == -2.0f);
    // token 2 is now an output token: next step it is penalized too, and 5 wins.
    std::vector<float> row2 = kLogits;
    CHECK(s.sample(row2).token == 5);
  }
  SECTION("frequency and presence penalties subtract count * f + p for generated tokens") {
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.1f;
    Sampler s(p, {}, 0);
    std::vector<float> row = kLogits;
    CHECK(s.sample(row).token == 1);  // 3.0
    row = kLogits;
    CHECK(s.sample(row).token == 1);  // 3.0 - 0.4 = 2.6 still best
    CHECK(row[1] == Approx(2.6f));
    row = kLogits;
    CHECK(s.sample(row).token == 2);  // 3.0 - 0.7 = 2.3 < 2.5
    CHECK(row[1] == Approx(2.3f));
  }
}

TEST_CASE("logprobs are the raw model distribution's", "[sampling]") {
  SamplingParams p;
  p.temperature = 0.5f;
  p.repetition_penalty = 1.5f;  // must not change the reported logprobs
  p.num_logprobs = 3;
  const std::vector<int32_t> prompt = {1};
  Sampler s(p, prompt, 9);
  std::vector<float> row = kLogits;
  const auto r = s.sample(row);
  double z = 0;
  for (float l : kLogits) z += std::exp(static_cast<double>(l));
  CHECK(r.logprob == Approx(kLogits[r.token] - std::log(z)).epsilon(1e-6));
  REQUIRE(r.top_logprobs.size() == 3);
  CHECK(r.top_logprobs[0].token == 1);
  CHECK(r.top_logprobs[1].token == 2);  // 2 and 5 tie at 2.5: lower id first
  CHECK(r.top_logprobs[2].token == 5);
  CHECK(r.top_logprobs[0].logprob == Approx(3.0 - std::log(z)).epsilon(1e-6));
}

TEST_CASE("logit_bias is added before sampling, greedy included; logprobs stay the raw model's", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  p.num_logprobs = 2;
  const auto greedy = [&](const SamplingParams& params) {
    Sampler s(params, {}, 1);
    std::vector<float> row = kLogits;
    return s.sample(row);
  };
  const SampleResult plain = greedy(p);
  REQUIRE(plain.token == 1);  // 3.0
  p.logit_bias = {{1, -100.0f}};
  const SampleResult banned = greedy(p);
  CHECK(banned.token == 2);  // the second best (2.5, lower id than 5)
  // The reported logprob is that of the unbiased distribution, its second-best entry.
  CHECK(banned.logprob == plain.top_logprobs[1].logprob);
  CHECK(banned.top_logprobs[0].token == 1);
  p.logit_bias = {{7, 100.0f}};  // the worst token (-4.0) forced
  CHECK(greedy(p).token == 7);
  p.logit_bias = {{9, 0.6f}};  // 2.0 + 0.6 beats 2.5 but not 3.0
  CHECK(greedy(p).token == 1);
  p.logit_bias = {{9, 1.5f}};
  CHECK(greedy(p).token == 9);
  // With sampling, a -100 bias removes the token from the draw entirely.
  SamplingParams q;
  q.temperature = 1.0f;
  q.logit_bias = {{1, -100.0f}, {2, -100.0f}};
  Sampler s(q, {}, 7);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> row = kLogits;
    const int32_t t = s.sample(row).token;
    CHECK((t != 1 && t != 2));
  }
}

TEST_CASE("allowed_token_ids: only those are ever drawn, greedy or not", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  p.allowed_token_ids = {3, 7, 8};
  Sampler g(p, {}, 1);
  std::vector<float> row = kLogits;
  CHECK(g.sample(row).token == 8);  // 1.5, the best of the three
  p.temperature = 2.0f;
  Sampler s(p, {}, 9);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 3000; ++i) {
    std::vector<float> r = kLogits;
    ++seen[s.sample(r).token];
  }
  CHECK(seen.size() == 3);
  CHECK(seen.count(3) == 1);
  CHECK(seen.count(7) == 1);
  CHECK(seen.count(8) == 1);
}

TEST_CASE("min_tokens masks the stop ids until that many tokens were sampled; logprobs stay raw", "[sampling]") {
  SamplingParams p;
  p.temperature = 0;
  p.num_logprobs = 1;
  p.min_tokens = 2;
  p.min_tokens_banned = {1, 2};  // the best two (3.0, 2.5)
  Sampler s(p, {}, 1);
  std::vector<float> row = kLogits;
  const SampleResult first = s.sample(row);
  CHECK(first.token == 5);  // 2.5, the best left
  CHECK(first.top_logprobs[0].token == 1);  // reported from the unmasked distribution
  row = kLogits;
  s.forget(s.sample(row).token);  // refused by the caller: does not count towards min_tokens
  row = kLogits;
  CHECK(s.sample(row).token == 5);
  row = kLogits;
  CHECK(s.sample(row).token == 1);  // two tokens sampled: no mask
}
