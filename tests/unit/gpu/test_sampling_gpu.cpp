// [gpu] Sampling on the device against the host sampler (server/engine/sampling.cpp) on the same fp32
// logits: greedy tokens and their logprobs must be bit-identical, row by row, whatever the batch.
// The rows cover what changes an argmax or a softmax: random and peaked logits, exact ties (the
// lowest id wins), -0 against +0, -inf entries and rows of -inf, +inf, NaN at id 0 (the host's
// loop keeps it) and elsewhere (never chosen), at vocabularies from 1 to Llama 3's 128,256.
//
// The top-k prefilter (sample_candidates) is held to the same: for every row and every sampling
// parameter combination (temperature, top-k, top-p, min-p, logprobs, seeds), a sampler drawing
// from the device's candidates returns the host sampler's token, logprob and top_logprobs bit
// for bit over several draws in a row (the RNGs stay in step), or declines (nullopt) exactly when
// the candidates cannot decide - and then samples the row. NaN rows are left out there: the
// host's sort has no order for them (a model that emits NaN is broken either way).
//
// On a real GPU as in the emulator, bit for bit: the device's ExpSum terms are exp_nonpositive's
// IEEE operations (kernels/sampling_ops.hpp), the host's own, and the logs are taken on the host.
#include <bit>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <limits>

#include "cuda_test_util.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "sampling_test_util.hpp"
#include "server/engine/sampling.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// One row of `vocab` logits of the given kind (seeded).
std::vector<float> make_row(int kind, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<float> row(static_cast<std::size_t>(vocab));
  for (float& v : row) v = normal(rng);
  auto at = [&](int64_t i) -> float& { return row[static_cast<std::size_t>(i)]; };
  switch (kind) {
    case 0: break;                         // LM-like: N(0, 3)
    case 1: at(pick(rng)) = 40.0f; break;  // peaked
    case 2:                                // the maximum tied at several ids
      for (int i = 0; i < 5; ++i) at(pick(rng)) = 25.0f;
      break;
    case 3:  // few distinct values: ties everywhere, the maximum among them
      for (float& v : row) v = std::round(v / 4.0f);
      break;
    case 4:  // all zero, some of them -0: equal to +0 for the argmax
      for (float& v : row) v = (rng() & 1) ? -0.0f : 0.0f;
      break;
    case 5:  // masked entries (-inf), the maximum among the rest
      for (float& v : row)
        if (rng() % 3 == 0) v = -kInf;
      break;
    case 6: std::fill(row.begin(), row.end(), -kInf); break;  // nothing allowed: id 0, NaN logprob
    case 7: at(pick(rng)) = kInf; break;                     // +inf: that id, NaN logprob
    case 8: at(0) = kNaN; break;                             // NaN at id 0: the host keeps id 0
    case 9: at(pick(rng)) = kNaN; break;                     // NaN elsewhere: never chosen
    case 10: std::fill(row.begin(), row.end(), 1.5f); break; // flat: id 0
    default: break;
  }
  return row;
}
constexpr int kNumKinds = 11;

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b) || (a != a && b != b); }
bool logprob_matches(float device, float host) { return same_bits(device, host); }

// Greedy on the device for `rows` (one launch, each row cut into `slices` CTAs, 0: as the kernel
// chooses), against the host sampler row by row.
void check_greedy(Backend& gpu, const std::vector<std::vector<float>>& rows, int64_t vocab, int32_t slices = 0) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  DeviceBuffer d_logits = to_device(gpu, flat);
  DeviceBuffer d_out(gpu, rows.size() * sizeof(GreedyRow));
  GreedySampleParams p;
  p.logits = d_logits.as<float>();
  p.num_rows = static_cast<int64_t>(rows.size());
  p.vocab_size = vocab;
  p.out = d_out.as<GreedyRow>();
  p.slices = slices;
  gpu.sample_greedy(p, Stream{});
  const std::vector<GreedyRow> picks = to_host<GreedyRow>(gpu, d_out, rows.size());

  SamplingParams params;
  params.temperature = 0.0f;
  params.num_logprobs = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    INFO("vocab " << vocab << " row " << r);
    Sampler host(params, {}, 1);
    std::vector<float> scratch = rows[r];
    const SampleResult want = host.sample(scratch);
    Sampler device(params, {}, 1);
    REQUIRE(device.greedy_on_raw_logits());
    const SampleResult got = device.accept_greedy(picks[r]);
    CHECK(got.token == want.token);
    INFO("logprob host " << want.logprob << " device " << got.logprob);
    CHECK(logprob_matches(got.logprob, want.logprob));
  }
}

// One launch of the prefilter over `rows`, each with its own 1/T.
Candidates prefilter(Backend& gpu, const std::vector<std::vector<float>>& rows, int64_t vocab,
                     const std::vector<float>& inv_t, int32_t k, const std::vector<uint8_t>& raw_wanted = {}) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  DeviceBuffer d_logits = to_device(gpu, flat);
  return prefilter_device(gpu, d_logits.as<float>(), rows.size(), vocab, inv_t, k, 0, raw_wanted);
}

// The K best of a row by the host's order, ascending ids: what the prefilter must return.
std::vector<int32_t> best_ids(const std::vector<float>& row, int32_t k) {
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const float x = row[static_cast<std::size_t>(a)], y = row[static_cast<std::size_t>(b)];
    return x > y || (x == y && a < b);
  });
  ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(k)));
  std::sort(ids.begin(), ids.end());
  return ids;
}

struct PrefilterStats {
  int decided = 0;
  int declined = 0;
};

void check_candidates(Backend& gpu, const std::vector<std::vector<float>>& rows, int64_t vocab, PrefilterStats& stats) {
  const int32_t k = kMaxSampleCandidates;
  for (const float temperature : {0.0f, 0.7f, 1.0f, 1.5f}) {
    const float inv = temperature > 0 ? 1.0f / temperature : 1.0f;
    const Candidates c = prefilter(gpu, rows, vocab, std::vector<float>(rows.size(), inv), k);
    // Rows that want no raw_sum (every other one): raw_sum 0, all else bit for bit as above; the
    // draws below, which take it for logprobs only, are then the host's without logprobs too.
    std::vector<uint8_t> every_other(rows.size());
    for (std::size_t r = 0; r < rows.size(); ++r) every_other[r] = r % 2;
    const Candidates half = prefilter(gpu, rows, vocab, std::vector<float>(rows.size(), inv), k, every_other);
    CHECK(half.ids == c.ids);
    CHECK(std::memcmp(half.logits.data(), c.logits.data(), c.logits.size() * sizeof(float)) == 0);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      INFO("vocab " << vocab << " row " << r << " T " << temperature);
      CHECK(half.rows[r].max_logit == c.rows[r].max_logit);
      CHECK(half.rows[r].num_candidates == c.rows[r].num_candidates);
      CHECK(half.rows[r].scaled_sum.bits == c.rows[r].scaled_sum.bits);
      CHECK(half.rows[r].raw_sum.bits == (every_other[r] ? c.rows[r].raw_sum.bits : 0u));
    }
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const auto kr = static_cast<std::size_t>(c.rows[r].num_candidates);
      REQUIRE(kr == std::min<std::size_t>(static_cast<std::size_t>(vocab), static_cast<std::size_t>(k)));
      const std::span<const int32_t> ids(c.ids.data() + r * static_cast<std::size_t>(k), kr);
      const std::span<const float> logits(c.logits.data() + r * static_cast<std::size_t>(k), kr);
      if (temperature == 0.0f) {  // once per row: the exact K best, their logits as in the row
        INFO("vocab " << vocab << " row " << r);
        CHECK(std::vector<int32_t>(ids.begin(), ids.end()) == best_ids(rows[r], k));
        for (std::size_t i = 0; i < kr; ++i) CHECK(same_bits(logits[i], rows[r][static_cast<std::size_t>(ids[i])]));
      }
      for (const int top_k : {0, 1, 50, 1024, 2000})
        for (const float top_p : {1.0f, 0.95f, 0.5f, 0.999f})
          for (const float min_p : {0.0f, 0.05f})
            for (const int num_logprobs : {-1, 0, 5}) {
              if (temperature == 0.0f && (top_k > 1 || top_p < 1.0f || min_p > 0.0f)) continue;  // greedy ignores them
              SamplingParams params;
              params.temperature = temperature;
              params.top_k = top_k;
              params.top_p = top_p;
              params.min_p = min_p;
              params.num_logprobs = num_logprobs;
              params.seed = 1000u * r + static_cast<uint64_t>(top_k);
              INFO("vocab " << vocab << " row " << r << " T " << temperature << " top_k " << top_k << " top_p " << top_p
                            << " min_p " << min_p << " logprobs " << num_logprobs);
              Sampler host(params, {}, 0), device(params, {}, 0);
              REQUIRE(device.candidates_suffice(k));
              for (int draw = 0; draw < 3; ++draw) {  // the RNGs stay in step across draws
                std::vector<float> scratch = rows[r];
                const SampleResult want = host.sample(scratch);
                std::optional<SampleResult> got = device.sample_candidates(c.rows[r], ids, logits, vocab);
                if (got) {
                  ++stats.decided;
                } else {
                  ++stats.declined;
                  scratch = rows[r];
                  got = device.sample(scratch);
                }
                CHECK(got->token == want.token);
                CHECK(logprob_matches(got->logprob, want.logprob));
                REQUIRE(got->top_logprobs.size() == want.top_logprobs.size());
                for (std::size_t i = 0; i < want.top_logprobs.size(); ++i) {
                  CHECK(got->top_logprobs[i].token == want.top_logprobs[i].token);
                  CHECK(logprob_matches(got->top_logprobs[i].logprob, want.top_logprobs[i].logprob));
                }
              }
            }
    }
  }
}

}  // namespace

TEST_CASE("sample_candidates: drawing from the device's best 1,024 gives the host's tokens and logprobs", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  PrefilterStats stats;
  // NaN rows (kinds 8, 9) left out: see the file's comment.
  for (const int64_t vocab : {int64_t{7}, int64_t{1000}, int64_t{4099}, int64_t{128256}}) {
    // At Llama 3's vocabulary (each host draw sorts it) the kinds that differ most: LM-like,
    // peaked, ties everywhere, masked entries.
    const std::vector<int> kinds = vocab > 100000 ? std::vector<int>{0, 1, 3, 5} : std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 10};
    std::vector<std::vector<float>> rows;
    for (const int kind : kinds) rows.push_back(make_row(kind, vocab, static_cast<uint32_t>(31 * kind + vocab)));
    check_candidates(*gpu, rows, vocab, stats);
  }
  // Both outcomes happen: a peaked nucleus is decided on the candidates, a plain temperature draw
  // or a flat row's nucleus is not.
  std::printf("[sampling] prefilter decided %d draws, declined %d (sampled from the row)\n", stats.decided,
              stats.declined);
  CHECK(stats.decided > 0);
  CHECK(stats.declined > 0);
}

TEST_CASE("sample_greedy picks the host sampler's token with its logprob, bit for bit", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  REQUIRE(gpu->supports_device_sampling());
  // Small and odd vocabularies (a row shorter than the block, one element per thread, a partial
  // last stride), then real ones. The emulator runs fewer rows of the largest.
  for (const int64_t vocab : {int64_t{1}, int64_t{7}, int64_t{512}, int64_t{1000}, int64_t{4099}, int64_t{128256}}) {
    std::vector<std::vector<float>> rows;
    const int repeats = vocab >= 100000 && kEmulated ? 1 : 3;
    for (int rep = 0; rep < repeats; ++rep)
      for (int kind = 0; kind < kNumKinds; ++kind)
        rows.push_back(make_row(kind, vocab, static_cast<uint32_t>(1000 * rep + 17 * kind + vocab)));
    check_greedy(*gpu, rows, vocab);
  }
}

TEST_CASE("sample_greedy's pick does not depend on the batch it runs in", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t vocab = 4099;
  std::vector<std::vector<float>> rows;
  for (int kind = 0; kind < kNumKinds; ++kind) rows.push_back(make_row(kind, vocab, static_cast<uint32_t>(kind)));
  // Alone, then in one launch with every other row: the same picks either way.
  for (const auto& row : rows) check_greedy(*gpu, {row}, vocab);
  check_greedy(*gpu, rows, vocab);
}

TEST_CASE("sampling's results do not depend on how many CTAs a row is cut into", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  // Slices of one id up to 32 a row, over rows whose ties (kinds 2, 3, 4, 10) and -inf (5) cross
  // the slices' edges: the greedy picks equal the host's, the candidates (ids, logits, the row's
  // header) equal the one-slice launch's bit for bit, and that one's ids are the K best by the host's order.
  for (const int64_t vocab : {int64_t{37}, int64_t{1000}, int64_t{4099}}) {
    std::vector<std::vector<float>> rows;
    for (const int kind : {0, 1, 2, 3, 4, 5, 10}) rows.push_back(make_row(kind, vocab, static_cast<uint32_t>(7 * kind + vocab)));
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    DeviceBuffer d_logits = to_device(*gpu, flat);
    const std::vector<float> inv_t(rows.size(), 1.0f / 0.7f);
    const int32_t k = 300;
    const Candidates one = prefilter_device(*gpu, d_logits.as<float>(), rows.size(), vocab, inv_t, k, 1);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const auto kr = static_cast<std::size_t>(one.rows[r].num_candidates);
      const auto* ids = one.ids.data() + r * static_cast<std::size_t>(k);
      CHECK(std::vector<int32_t>(ids, ids + kr) == best_ids(rows[r], k));
    }
    for (const int32_t slices : {1, 2, 3, 7, 32}) {
      INFO("vocab " << vocab << " slices " << slices);
      check_greedy(*gpu, rows, vocab, slices);
      const Candidates c = prefilter_device(*gpu, d_logits.as<float>(), rows.size(), vocab, inv_t, k, slices);
      for (std::size_t r = 0; r < rows.size(); ++r) {
        INFO("row " << r);
        const CandidateRow &a = c.rows[r], &b = one.rows[r];
        CHECK(same_bits(a.max_logit, b.max_logit));
        CHECK(a.num_candidates == b.num_candidates);
        CHECK(a.raw_sum.bits == b.raw_sum.bits);
        CHECK(a.scaled_sum.bits == b.scaled_sum.bits);
        const std::size_t at = r * static_cast<std::size_t>(k), kr = static_cast<std::size_t>(b.num_candidates);
        CHECK(std::equal(c.ids.begin() + at, c.ids.begin() + at + kr, one.ids.begin() + at));
        for (std::size_t i = 0; i < kr; ++i) CHECK(same_bits(c.logits[at + i], one.logits[at + i]));
      }
    }
  }
}

TEST_CASE("sample_greedy and sample_candidates refuse a bad shape and do nothing for no rows", "[gpu][sampling]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  GreedySampleParams p;
  p.vocab_size = 0;
  CHECK_THROWS_AS(gpu->sample_greedy(p, Stream{}), std::invalid_argument);
  p.vocab_size = 16;
  p.num_rows = -1;
  CHECK_THROWS_AS(gpu->sample_greedy(p, Stream{}), std::invalid_argument);
  p.num_rows = 1;
  p.slices = -1;
  CHECK_THROWS_AS(gpu->sample_greedy(p, Stream{}), std::invalid_argument);
  p.slices = 0;
  p.num_rows = 0;  // no rows: no launch (null pointers never read)
  gpu->sample_greedy(p, Stream{});
  gpu->synchronize(Stream{});

  CandidateSampleParams c;
  c.vocab_size = 16;
  c.num_candidates = 0;
  CHECK_THROWS_AS(gpu->sample_candidates(c, Stream{}), std::invalid_argument);
  c.num_candidates = kMaxSampleCandidates + 1;
  CHECK_THROWS_AS(gpu->sample_candidates(c, Stream{}), std::invalid_argument);
  c.num_candidates = 8;
  c.vocab_size = 0;
  CHECK_THROWS_AS(gpu->sample_candidates(c, Stream{}), std::invalid_argument);
  c.vocab_size = 16;
  gpu->sample_candidates(c, Stream{});  // no rows
  gpu->synchronize(Stream{});

  // A workspace smaller than sampling_workspace_bytes (or none) is refused before any launch.
  p.num_rows = c.num_rows = 2;
  p.vocab_size = c.vocab_size = 4096;
  const std::size_t bytes = cuda::sampling_workspace_bytes(2, 4096, 0);
  REQUIRE(bytes > 0);
  CHECK(cuda::sampling_workspace_bytes(0, 4096, 0) == 0);
  DeviceBuffer small(*gpu, bytes);
  CHECK_THROWS_WITH(cuda::sample_greedy_cuda(p, small.data(), bytes - 1, nullptr),
                    Catch::Contains("workspace smaller than sampling_workspace_bytes()"));
  CHECK_THROWS_WITH(cuda::sample_candidates_cuda(c, nullptr, bytes, nullptr),
                    Catch::Contains("workspace smaller than sampling_workspace_bytes()"));
}
