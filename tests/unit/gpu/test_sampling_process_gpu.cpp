// [gpu] Logit processors and penalties on the device (Backend::process_logits), then the device's
// greedy pick or top-k prefilter, against the host sampler (server/engine/sampling.cpp) sampling the raw
// row itself: the same tokens, draw after draw (the RNGs stay in step while the penalties' counts
// and min_tokens' ban change), for allowed_token_ids (a mask that keeps several ids or one),
// logit_bias (up to every token but one pushed down), min_tokens' banned ids, repetition,
// frequency and presence penalties, and all of them at once, under greedy and seeded draws with
// top-k, top-p and min-p. The processed rows are also checked bit for bit against an independent
// reference: the processing written out in vLLM's order, one loop per processor. Structured
// outputs' token bitmasks (LogitProcessingBatch::add_row's grammar) are ANDed into the same mask.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "cuda_test_util.hpp"
#include "sampling_test_util.hpp"
#include "server/engine/sampling.hpp"
#include "server/grammar/matcher.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> make_row(int kind, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(static_cast<std::size_t>(vocab));
  for (float& v : row) v = normal(rng);
  if (kind == 1) row[static_cast<std::size_t>(rng() % vocab)] = 40.0f;  // peaked
  if (kind == 2)                                                         // ties everywhere
    for (float& v : row) v = std::round(v / 4.0f);
  if (kind == 3)  // masked entries
    for (float& v : row)
      if (rng() % 3 == 0) v = -kInf;
  return row;
}

int32_t argmax_of(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// The processor configurations of one row (its argmax is the favourite target).
std::vector<SamplingParams> processor_configs(const std::vector<float>& row, int64_t vocab) {
  const int32_t best = argmax_of(row);
  const auto id = [&](int64_t i) { return static_cast<int32_t>(i % vocab); };
  std::vector<SamplingParams> out;
  SamplingParams p;
  p.logit_bias = {{best, -100.0f}, {id(best + 1), 2.5f}};
  if (id(best + 1) == best) p.logit_bias.resize(1);
  out.push_back(p);
  p = {};
  p.allowed_token_ids = {id(best + 3), id(2), id(vocab - 1)};
  out.push_back(p);
  p = {};
  p.allowed_token_ids = {id(best + 5)};  // a mask that leaves one token
  out.push_back(p);
  if (vocab <= 4099) {  // every token but one pushed down by the bias
    p = {};
    for (int64_t t = 0; t < vocab; ++t)
      if (t != id(best + 2)) p.logit_bias.emplace_back(static_cast<int32_t>(t), -100.0f);
    out.push_back(p);
  }
  p = {};
  p.min_tokens = 2;  // banned for two draws, then not
  p.min_tokens_banned = {best, id(best + 7)};
  out.push_back(p);
  p = {};
  p.repetition_penalty = 1.3f;
  out.push_back(p);
  p = {};
  p.frequency_penalty = 0.7f;
  p.presence_penalty = 0.4f;
  out.push_back(p);
  p = {};  // all at once
  p.allowed_token_ids = {best, id(best + 1), id(best + 2), id(best + 9), id(11), id(vocab / 2)};
  p.logit_bias = {{id(best + 1), 1.25f}, {id(11), -3.0f}};
  if (id(best + 1) == id(11)) p.logit_bias.resize(1);
  p.min_tokens = 1;
  p.min_tokens_banned = {id(vocab / 2)};
  p.repetition_penalty = 0.8f;
  p.frequency_penalty = -0.5f;
  p.presence_penalty = 1.5f;
  out.push_back(p);
  return out;
}

// The independent reference: vLLM's processing order, one loop per processor.
void reference_process(std::vector<float>& l, const SamplingParams& p, const std::vector<int32_t>& prompt,
                       const std::map<int32_t, int>& counts, int generated, const std::vector<uint64_t>& grammar) {
  if (!grammar.empty()) {  // a structured output's mask first (the engine's order)
    for (std::size_t t = 0; t < l.size(); ++t) {
      const bool allowed = t / 64 < grammar.size() && (grammar[t / 64] >> (t % 64) & 1u);
      if (!allowed) l[t] = -kInf;
    }
  }
  if (!p.allowed_token_ids.empty()) {
    std::vector<float> kept(l.size(), -kInf);
    for (const int32_t t : p.allowed_token_ids) kept[static_cast<std::size_t>(t)] = l[static_cast<std::size_t>(t)];
    l = kept;
  }
  for (const auto& [t, b] : p.logit_bias) l[static_cast<std::size_t>(t)] += b;
  if (generated < p.min_tokens)
    for (const int32_t t : p.min_tokens_banned) l[static_cast<std::size_t>(t)] = -kInf;
  if (p.repetition_penalty != 1.0f) {
    std::set<int32_t> seen(prompt.begin(), prompt.end());
    for (const auto& [t, c] : counts) seen.insert(t);
    for (const int32_t t : seen) {
      float& v = l[static_cast<std::size_t>(t)];
      v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
    }
  }
  for (const auto& [t, c] : counts) {
    const float sub = p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
    l[static_cast<std::size_t>(t)] -= sub;
  }
}

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Structured outputs' token bitmasks (grammar::GrammarMatcher's layout) for a row: a sparse one,
// one that leaves a single token, and one shorter than the vocabulary (the rest masked).
std::vector<std::vector<uint64_t>> grammar_masks(const std::vector<float>& row, int64_t vocab) {
  const auto words = static_cast<std::size_t>((vocab + 63) / 64);
  std::mt19937 rng(static_cast<uint32_t>(vocab));
  std::vector<std::vector<uint64_t>> out;
  std::vector<uint64_t> sparse(words, 0);
  for (int64_t t = 0; t < vocab; ++t)
    if (rng() % 10 == 0 || t == argmax_of(row)) sparse[static_cast<std::size_t>(t / 64)] |= uint64_t{1} << (t % 64);
  out.push_back(sparse);
  std::vector<uint64_t> one(words, 0);
  const int64_t only = (argmax_of(row) + 1) % vocab;
  one[static_cast<std::size_t>(only / 64)] |= uint64_t{1} << (only % 64);
  out.push_back(one);
  if (words > 1) out.emplace_back(words / 2, ~uint64_t{0});
  return out;
}

struct Case {
  std::size_t row;  // into the rows
  SamplingParams params;
  std::vector<uint64_t> grammar;  // empty: none
  std::vector<int32_t> prompt;
  std::optional<Sampler> host, device;
  std::map<int32_t, int> counts;  // the reference's view of the output so far
  int generated = 0;
};

// One step for every case: process on the device, check the processed rows against the
// reference, then sample there (greedy picks or candidates) and compare with the host sampler.
void step(Backend& gpu, const std::vector<std::vector<float>>& rows, int64_t vocab, std::vector<Case>& cases, bool greedy,
          int& declined) {
  std::vector<float> flat;
  LogitProcessingBatch batch;
  batch.clear(vocab);
  for (const Case& c : cases) {
    flat.insert(flat.end(), rows[c.row].begin(), rows[c.row].end());
    batch.add_row(&*c.device, c.grammar);
  }
  const std::size_t n = cases.size();
  DeviceBuffer d_logits = to_device(gpu, flat);
  DeviceBuffer d_mask_index = to_device(gpu, batch.mask_index);
  DeviceBuffer d_masks = to_device(gpu, batch.masks.empty() ? std::vector<uint32_t>{0u} : batch.masks);
  DeviceBuffer d_begin = to_device(gpu, batch.edit_begin);
  DeviceBuffer d_edits = to_device(gpu, batch.edits.empty() ? std::vector<LogitEdit>{LogitEdit{}} : batch.edits);
  LogitProcessParams pp;
  pp.logits = d_logits.as<float>();
  pp.num_rows = static_cast<int64_t>(n);
  pp.vocab_size = vocab;
  pp.mask_index = d_mask_index.as<int32_t>();
  pp.masks = d_masks.as<uint32_t>();
  pp.mask_words = batch.mask_words;
  pp.edit_begin = d_begin.as<int32_t>();
  pp.edits = d_edits.as<LogitEdit>();
  gpu.process_logits(pp, Stream{});
  const std::vector<float> processed = to_host<float>(gpu, d_logits, flat.size());
  const auto v = static_cast<std::size_t>(vocab);
  for (std::size_t i = 0; i < n; ++i) {
    Case& c = cases[i];
    std::vector<float> want = rows[c.row];
    reference_process(want, c.params, c.prompt, c.counts, c.generated, c.grammar);
    bool same = true;
    for (std::size_t t = 0; t < v; ++t) same = same && same_bits(processed[i * v + t], want[t]);
    INFO("vocab " << vocab << " case " << i);
    CHECK(same);
  }

  std::vector<GreedyRow> picks;
  Candidates cand;
  const int32_t k = static_cast<int32_t>(std::min<int64_t>(kMaxSampleCandidates, vocab));
  if (greedy) {
    DeviceBuffer d_out(gpu, n * sizeof(GreedyRow));
    GreedySampleParams p{d_logits.as<float>(), static_cast<int64_t>(n), vocab, d_out.as<GreedyRow>()};
    gpu.sample_greedy(p, Stream{});
    picks = to_host<GreedyRow>(gpu, d_out, n);
  } else {
    std::vector<float> inv_t;
    for (const Case& c : cases) inv_t.push_back(c.params.temperature > 1e-5f ? 1.0f / c.params.temperature : 1.0f);
    cand = prefilter_device(gpu, d_logits.as<float>(), n, vocab, inv_t, k);
  }

  for (std::size_t i = 0; i < n; ++i) {
    Case& c = cases[i];
    INFO("vocab " << vocab << " case " << i << " T " << c.params.temperature << " top_k " << c.params.top_k << " top_p "
                  << c.params.top_p << " min_p " << c.params.min_p);
    // (Later, min_tokens may be past; a grammar-only row has no processor.)
    if (c.generated == 0 && c.grammar.empty()) REQUIRE(c.device->processed_on_device());
    std::vector<float> scratch = rows[c.row];
    if (!c.grammar.empty()) grammar::apply_token_bitmask(c.grammar, scratch);  // as Engine::sample_structured
    const SampleResult want = c.host->sample(scratch);
    SampleResult got;
    if (greedy) {
      REQUIRE(c.device->greedy_on_device());
      got = c.device->accept_greedy(picks[i]);
    } else {
      REQUIRE(c.device->candidates_on_device(k));
      const auto at = i * static_cast<std::size_t>(k);
      const auto kr = static_cast<std::size_t>(cand.rows[i].num_candidates);
      std::optional<SampleResult> drawn =
          c.device->sample_candidates(cand.rows[i], {cand.ids.data() + at, kr}, {cand.logits.data() + at, kr}, vocab);
      if (!drawn) {  // the engine's path: the processed row comes back and is drawn from
        ++declined;
        std::vector<float> row(processed.begin() + static_cast<std::ptrdiff_t>(i * v),
                               processed.begin() + static_cast<std::ptrdiff_t>((i + 1) * v));
        drawn = c.device->sample_processed(row);
      }
      got = *drawn;
    }
    CHECK(got.token == want.token);
    ++c.counts[want.token];
    ++c.generated;
  }
}

void check_processing(Backend& gpu, int64_t vocab, const std::vector<int>& kinds, bool all_draws, int& declined) {
  std::vector<std::vector<float>> rows;
  for (const int kind : kinds) rows.push_back(make_row(kind, vocab, static_cast<uint32_t>(7 * kind + vocab)));
  struct Draw {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  std::vector<Draw> draws = {{0.0f, 0, 1.0f, 0.0f}, {0.8f, 50, 0.9f, 0.0f}, {1.0f, 0, 0.95f, 0.05f}, {0.7f, 0, 1.0f, 0.1f},
                             {1.2f, 0, 1.0f, 0.0f}};
  if (!all_draws) draws = {draws[0], draws[1]};
  for (const bool greedy : {true, false}) {
    std::vector<Case> cases;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      // Every processor configuration; then each grammar mask alone and with all processors.
      std::vector<std::pair<SamplingParams, std::vector<uint64_t>>> configs;
      const std::vector<SamplingParams> processors = processor_configs(rows[r], vocab);
      for (const SamplingParams& config : processors) configs.emplace_back(config, std::vector<uint64_t>{});
      // (Not at 128k: the emulator's histogram atomics on rows of mostly -inf ties are slow.)
      for (const std::vector<uint64_t>& mask : all_draws ? grammar_masks(rows[r], vocab) : std::vector<std::vector<uint64_t>>{}) {
        configs.emplace_back(SamplingParams{}, mask);
        configs.emplace_back(processors.back(), mask);
      }
      for (const auto& [config, grammar] : configs)
        for (const Draw& d : draws) {
          if (greedy && d.temperature != 0.0f) continue;  // the greedy batch: greedy rows only
          Case c;
          c.row = r;
          c.params = config;
          c.grammar = grammar;
          c.params.temperature = d.temperature;
          c.params.top_k = d.top_k;
          c.params.top_p = d.top_p;
          c.params.min_p = d.min_p;
          c.params.seed = 977u * r + cases.size();
          // A prompt that holds the argmax and a few more (the repetition penalty's set).
          c.prompt = {argmax_of(rows[r]), static_cast<int32_t>(3 % vocab), static_cast<int32_t>((vocab - 2) % vocab),
                      static_cast<int32_t>(3 % vocab)};
          c.host.emplace(c.params, c.prompt, 0);
          c.device.emplace(c.params, c.prompt, 0);
          cases.push_back(std::move(c));
        }
    }
    for (int draw = 0; draw < 3; ++draw) step(gpu, rows, vocab, cases, greedy, declined);
  }
}

}  // namespace

TEST_CASE("process_logits, then the device's pick or candidates, give the host sampler's tokens", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  int declined = 0;
  check_processing(*gpu, 7, {0, 1, 2}, true, declined);
  check_processing(*gpu, 1000, {0, 1, 2, 3}, true, declined);
  check_processing(*gpu, 4099, {0, 1, 3}, true, declined);
  check_processing(*gpu, 128256, {0}, false, declined);
  // Plain temperature draws over a processed row decline: the processed row came back and was
  // drawn from on the host, as the engine does.
  CHECK(declined > 0);
}

TEST_CASE("process_logits refuses a bad shape and does nothing for no rows", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  LogitProcessParams p;
  p.vocab_size = 0;
  CHECK_THROWS_AS(gpu->process_logits(p, Stream{}), std::invalid_argument);
  p.vocab_size = 100;
  p.mask_words = 3;  // 4 needed
  CHECK_THROWS_AS(gpu->process_logits(p, Stream{}), std::invalid_argument);
  p.mask_words = 4;
  p.num_rows = -1;
  CHECK_THROWS_AS(gpu->process_logits(p, Stream{}), std::invalid_argument);
  p.num_rows = 0;
  gpu->process_logits(p, Stream{});
  gpu->synchronize(Stream{});
}
