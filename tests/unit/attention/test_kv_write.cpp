// kv_write: calibration on a sequence's first chunk, frozen scales afterwards, saturation
// counts on inputs built to exceed the frozen amax, exact bytes in exactly the right slots,
// bf16 rounding, padding slots, thread-count invariance, contract checks. Expected values are
// computed here by plain loops and formulas, independently of the kernel.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "attention_test_util.hpp"
#include "kernels/cpu/kv_write_cpu.hpp"

using namespace fp8serve;
using namespace fp8serve::test;
using fp8serve::cpu::ThreadPool;

namespace {

// One kv_write call over a PoolFixture whose seqs' num_new tokens are this step's tokens.
struct WriteStep {
  BatchArrays arrays;
  std::vector<float> k, v;
  KvWriteParams params;
  KvWriteCounts counts;

  WriteStep(PoolFixture& pool, std::vector<float> k_, std::vector<float> v_, float margin)
      : arrays(pool), k(std::move(k_)), v(std::move(v_)) {
    params.k = k.data();
    params.v = v.data();
    params.k_token_stride = params.v_token_stride = static_cast<int64_t>(pool.num_kv_heads) * pool.head_dim;
    params.cache = pool.view();
    params.batch = arrays.batch(pool);
    params.scale_margin = margin;
    params.counts = &counts;
  }
  void set_calibrate(int32_t seq, bool on) {
    arrays.calibrate[static_cast<std::size_t>(seq)] = on ? 1 : 0;
  }
};

float amax_of(const std::vector<float>& x, std::size_t first, std::size_t last) {
  float m = 0.0f;
  for (std::size_t i = first; i < last; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// bf16 round-to-nearest-even computed another way: scale the value so its 8 significant bits
// are the integer part, let nearbyint (ties to even in the default mode) round, scale back.
uint16_t bf16_by_nearbyint(float x) {
  if (x == 0.0f || !std::isfinite(x)) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return static_cast<uint16_t>(b >> 16);
  }
  const int e = std::ilogb(x);
  const double unit = std::ldexp(1.0, std::max(e, -126) - 7);
  const float r = static_cast<float>(std::nearbyint(static_cast<double>(x) / unit) * unit);
  uint32_t b;
  std::memcpy(&b, &r, 4);
  return static_cast<uint16_t>(b >> 16);
}

}  // namespace

TEST_CASE("kv_write calibrates on the first chunk, quantizes into the right slots, freezes after", "[kv_write]") {
  std::mt19937 rng(1);
  ThreadPool threads(2);
  const int32_t nkv = 2, hd = 64, row = nkv * hd;
  const float margin = 1.25f;
  // Sequence 0: first prefill chunk of 37 tokens. Sequence 1: decode with frozen scales.
  // Sequence 2: a second first-chunk sequence whose values are all zero.
  PoolFixture pool(KvDtype::fp8_e4m3, 16, nkv, hd, {{37, 37}, {90, 1}, {5, 5}}, rng);
  pool.k_scales = {123.0f, 0.005f, 7.0f};
  pool.v_scales = {123.0f, 0.03f, 7.0f};
  std::vector<float> k = random_normal(43 * row, rng, 2.0f), v = random_normal(43 * row, rng, 0.5f);
  std::fill(k.begin() + 38 * row, k.end(), 0.0f);
  std::fill(v.begin() + 38 * row, v.end(), 0.0f);
  const std::vector<uint8_t> k_before = pool.k_bytes, v_before = pool.v_bytes;
  WriteStep step(pool, k, v, margin);
  step.set_calibrate(0, true);
  step.set_calibrate(2, true);
  step.params.batch = step.arrays.batch(pool);
  cpu::kv_write_cpu(step.params, threads);

  const float k_expected = amax_of(k, 0, 37 * row) * margin / 448.0f;
  const float v_expected = amax_of(v, 0, 37 * row) * margin / 448.0f;
  CHECK(pool.k_scales[0] == k_expected);
  CHECK(pool.v_scales[0] == v_expected);
  CHECK(pool.k_scales[1] == 0.005f);  // frozen: untouched
  CHECK(pool.v_scales[1] == 0.03f);
  CHECK(pool.k_scales[2] == FLT_MIN);  // an all-zero chunk never gives a zero scale
  CHECK(pool.v_scales[2] == FLT_MIN);

  // Every written byte is the codec's encoding of x / scale, at the slot the test computes;
  // every other byte of the pool is untouched.
  std::vector<uint8_t> k_expect = k_before, v_expect = v_before;
  uint64_t k_sat = 0, v_sat = 0;
  int32_t token = 0;
  for (int32_t s = 0; s < 3; ++s) {
    const SeqSpec spec = pool.seqs[static_cast<std::size_t>(s)];
    for (int32_t i = 0; i < spec.num_new; ++i, ++token) {
      const int32_t pos = spec.context_len - spec.num_new + i;
      for (int32_t h = 0; h < nkv; ++h) {
        for (int32_t d = 0; d < hd; ++d) {
          const std::size_t src = static_cast<std::size_t>(token) * row + h * hd + d;
          const float yk = k[src] / pool.k_scales[s], yv = v[src] / pool.v_scales[s];
          k_expect[pool.k_index(s, pos, h, d)] = fp8_e4m3_encode(yk);
          v_expect[pool.v_index(s, pos, h, d)] = fp8_e4m3_encode(yv);
          k_sat += std::fabs(yk) > 464.0f;  // beyond 448 + half an ulp: the clamp changed it
          v_sat += std::fabs(yv) > 464.0f;
        }
      }
    }
  }
  CHECK(pool.k_bytes == k_expect);
  CHECK(pool.v_bytes == v_expect);
  CHECK(step.counts.num_elements == 43u * row);
  CHECK(step.counts.num_k_saturated == k_sat);
  CHECK(step.counts.num_v_saturated == v_sat);
  CHECK(k_sat > 0);  // sequence 1: N(0, 2) keys against a 0.005 scale: 448 * 0.005 = 2.24
}

TEST_CASE("kv_write saturation counts on tokens beyond the frozen amax", "[kv_write]") {
  std::mt19937 rng(2);
  ThreadPool threads(2);
  const int32_t nkv = 1, hd = 16;
  PoolFixture pool(KvDtype::fp8_e4m3, 8, nkv, hd, {{4, 4}}, rng);
  // Prefill: values in [-0.5, 0.5] and one element at exactly 0.5 -> amax 0.5, margin 1.
  std::vector<float> k(4 * hd), v(4 * hd);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = v[i] = static_cast<float>(i % 11) / 22.0f - 0.25f;
  k[5] = 0.5f;
  v[7] = -0.5f;
  {
    WriteStep step(pool, k, v, 1.0f);
    step.set_calibrate(0, true);
    step.params.batch = step.arrays.batch(pool);
    cpu::kv_write_cpu(step.params, threads);
  }
  const float k_scale = pool.k_scales[0];
  CHECK(k_scale == 0.5f / 448.0f);
  // Decode token at position 4: 3 elements beyond the amax by 2x, 1 by 1.1x, one NaN (not
  // counted), one +inf (counted), one exactly at 448 * scale (not beyond), the rest small.
  pool.seqs = {{5, 1}};
  std::vector<float> kd(hd, 0.1f), vd(hd, 0.1f);
  kd[0] = 1.0f;
  kd[1] = -1.0f;
  kd[2] = 1.0f;
  kd[3] = 0.55f;
  kd[4] = NAN;
  kd[5] = INFINITY;
  kd[6] = 448.0f * k_scale;
  kd[7] = 460.0f * k_scale;  // above 448 but within its rounding interval: rounds, not clipped
  vd[9] = -0.75f;
  WriteStep decode(pool, kd, vd, 1.0f);
  cpu::kv_write_cpu(decode.params, threads);
  CHECK(pool.k_scales[0] == k_scale);  // frozen
  CHECK(decode.counts.num_k_saturated == 5);
  CHECK(decode.counts.num_v_saturated == 1);
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 0)] == 0x7e);  // +448
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 1)] == 0xfe);  // -448
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 4)] == 0x7f);  // NaN stays NaN
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 5)] == 0x7e);
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 6)] == 0x7e);
  CHECK(pool.k_bytes[pool.k_index(0, 4, 0, 7)] == 0x7e);
  // A larger margin leaves headroom: the same decode token clips less.
  PoolFixture roomy(KvDtype::fp8_e4m3, 8, nkv, hd, {{4, 4}}, rng);
  {
    WriteStep step(roomy, k, v, 2.5f);
    step.set_calibrate(0, true);
    step.params.batch = step.arrays.batch(roomy);
    cpu::kv_write_cpu(step.params, threads);
  }
  roomy.seqs = {{5, 1}};
  WriteStep decode2(roomy, kd, vd, 2.5f);
  cpu::kv_write_cpu(decode2.params, threads);
  CHECK(decode2.counts.num_k_saturated == 1);  // only the infinity
  CHECK(decode2.counts.num_v_saturated == 0);
}

TEST_CASE("kv_write into a bf16 pool rounds to nearest even and ignores scales", "[kv_write]") {
  std::mt19937 rng(3);
  ThreadPool threads(2);
  const int32_t nkv = 2, hd = 8, row = nkv * hd;
  PoolFixture pool(KvDtype::bf16, 4, nkv, hd, {{6, 6}, {3, 2}}, rng);
  std::vector<float> k = random_normal(8 * row, rng, 3.0f), v = random_normal(8 * row, rng);
  // Ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (to even: 1); 1 + 3 * 2^-8 goes up.
  k[0] = 1.0f + 0x1p-8f;
  k[1] = 1.0f + 3 * 0x1p-8f;
  k[2] = -(1.0f + 0x1p-8f + 0x1p-20f);
  k[3] = 1e-40f;  // a float denormal
  k[4] = 3.0e38f;
  WriteStep step(pool, k, v, 1.0f);
  step.set_calibrate(0, true);  // meaningless for bf16: no scale is written
  step.params.k_token_stride = step.params.v_token_stride = 0;  // 0 = packed
  step.params.batch = step.arrays.batch(pool);
  pool.k_scales[0] = 5.0f;
  cpu::kv_write_cpu(step.params, threads);
  CHECK(pool.k_scales[0] == 5.0f);
  int32_t token = 0;
  for (int32_t s = 0; s < 2; ++s) {
    const SeqSpec spec = pool.seqs[static_cast<std::size_t>(s)];
    for (int32_t i = 0; i < spec.num_new; ++i, ++token) {
      for (int32_t h = 0; h < nkv; ++h) {
        for (int32_t d = 0; d < hd; ++d) {
          const std::size_t src = static_cast<std::size_t>(token) * row + h * hd + d;
          uint16_t got;
          const int32_t pos = spec.context_len - spec.num_new + i;
          std::memcpy(&got, pool.k_bytes.data() + 2 * pool.k_index(s, pos, h, d), 2);
          INFO("k = " << k[src]);
          CHECK(got == bf16_by_nearbyint(k[src]));
          std::memcpy(&got, pool.v_bytes.data() + 2 * pool.v_index(s, pos, h, d), 2);
          CHECK(got == bf16_by_nearbyint(v[src]));
        }
      }
    }
  }
  CHECK(bf16_encode(k[0]) == 0x3f80);
  CHECK(bf16_encode(k[1]) == 0x3f82);
  CHECK(step.counts.num_k_saturated == 0);
}

TEST_CASE("kv_write skips padding slots and is thread-count invariant", "[kv_write]") {
  std::mt19937 rng(4);
  const int32_t nkv = 3, hd = 32, row = nkv * hd;
  PoolFixture a(KvDtype::fp8_e4m3, 16, nkv, hd, {{100, 100}, {40, 20}, {3, 1}}, rng);
  PoolFixture b = a;
  std::vector<float> k = random_normal(121 * row, rng), v = random_normal(121 * row, rng);
  ThreadPool one(1), three(3);
  WriteStep sa(a, k, v, 1.5f), sb(b, k, v, 1.5f);
  for (WriteStep* s : {&sa, &sb}) {
    s->set_calibrate(0, true);
    s->arrays.slot_mapping[50] = -1;  // a padding token: written nowhere
  }
  sa.params.batch = sa.arrays.batch(a);
  sb.params.batch = sb.arrays.batch(b);
  const std::vector<uint8_t> before = a.k_bytes;
  cpu::kv_write_cpu(sa.params, one);
  cpu::kv_write_cpu(sb.params, three);
  CHECK(a.k_bytes == b.k_bytes);
  CHECK(a.v_bytes == b.v_bytes);
  CHECK(a.k_scales == b.k_scales);
  CHECK(sa.counts == sb.counts);
  CHECK(sa.counts.num_elements == 120u * row);
  for (int32_t h = 0; h < nkv; ++h) {
    for (int32_t d = 0; d < hd; ++d) CHECK(a.k_bytes[a.k_index(0, 50, h, d)] == before[a.k_index(0, 50, h, d)]);
  }
  // Counts accumulate across calls (one counter per layer for the whole server run).
  cpu::kv_write_cpu(sa.params, one);
  CHECK(sa.counts.num_elements == 240u * row);
}

TEST_CASE("kv_write rejects params that break the contract and writes nothing", "[kv_write]") {
  std::mt19937 rng(6);
  ThreadPool threads(1);
  PoolFixture pool(KvDtype::fp8_e4m3, 16, 1, 16, {{20, 2}}, rng);
  std::vector<float> k = random_normal(32, rng), v = random_normal(32, rng);
  WriteStep step(pool, k, v, 1.0f);
  const std::vector<uint8_t> before = pool.k_bytes;
  SECTION("slot outside the pool") {
    step.arrays.slot_mapping[1] = static_cast<int64_t>(pool.num_blocks) * 16;
    CHECK_THROWS_AS(cpu::kv_write_cpu(step.params, threads), std::invalid_argument);
  }
  SECTION("frozen scale that is not finite and positive") {
    pool.k_scales[0] = -1.0f;
    CHECK_THROWS_AS(cpu::kv_write_cpu(step.params, threads), std::invalid_argument);
    pool.k_scales[0] = INFINITY;
    CHECK_THROWS_AS(cpu::kv_write_cpu(step.params, threads), std::invalid_argument);
  }
  SECTION("bad margin for a calibrating sequence") {
    step.set_calibrate(0, true);
    step.params.scale_margin = 0.0f;
    CHECK_THROWS_AS(cpu::kv_write_cpu(step.params, threads), std::invalid_argument);
  }
  SECTION("token stride shorter than a token") {
    step.params.k_token_stride = 8;
    CHECK_THROWS_AS(cpu::kv_write_cpu(step.params, threads), std::invalid_argument);
  }
  CHECK(pool.k_bytes == before);
}

TEST_CASE("thread pool runs every item once and rethrows", "[thread_pool]") {
  for (int n : {1, 2, 4}) {
    ThreadPool pool(n);
    CHECK(pool.num_threads() == n);
    for (int round = 0; round < 50; ++round) {
      std::vector<int> hits(1000, 0);
      pool.parallel_for(1000, [&hits](int64_t i) { hits[static_cast<std::size_t>(i)] += 1; });
      CHECK(std::count(hits.begin(), hits.end(), 1) == 1000);
    }
    CHECK_THROWS_AS(pool.parallel_for(10, [](int64_t i) { if (i == 7) throw std::runtime_error("x"); }),
                    std::runtime_error);
    int after = 0;
    pool.parallel_for(1, [&after](int64_t) { after = 1; });  // usable after an exception
    CHECK(after == 1);
  }
  CHECK_THROWS_AS(ThreadPool(0), std::invalid_argument);
}
