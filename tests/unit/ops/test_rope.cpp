// RoPE: inv_freq and the cos/sin table against transformers' own numbers (a committed table of
// float32 bit patterns) and against an independent long-double re-derivation of the formulas;
// the rotation against a readable double-precision loop.
#include <catch2/catch.hpp>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"
#include "ops_test_util.hpp"

namespace {

#include "rope_reference.inc"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

RopeConfig config_of(const RopeReferenceCase& c) {
  RopeConfig config;
  config.rotary_dim = c.head_dim;
  config.theta = c.theta;
  if (c.llama3) {
    config.scaling = RopeScaling::llama3;
    config.factor = c.factor;
    config.low_freq_factor = c.low_freq_factor;
    config.high_freq_factor = c.high_freq_factor;
    config.original_max_position_embeddings = c.original_max_position_embeddings;
  }
  return config;
}

// Meta's apply_scaling (llama3 reference code), in long double: an independent statement of the
// same rule, without torch's float32 rounding order.
long double llama3_exact(long double freq, const RopeConfig& c) {
  const long double old_len = c.original_max_position_embeddings;
  const long double low_wavelen = old_len / c.low_freq_factor;
  const long double high_wavelen = old_len / c.high_freq_factor;
  const long double wavelen = 2.0L * std::numbers::pi_v<long double> / freq;
  if (wavelen < high_wavelen) return freq;
  if (wavelen > low_wavelen) return freq / c.factor;
  const long double smooth =
      (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  return (1.0L - smooth) * freq / c.factor + smooth * freq;
}

}  // namespace

TEST_CASE("rope inv_freq equals transformers' (bitwise but for torch's pow rounding)", "[rope]") {
  int64_t exact = 0;
  int64_t total = 0;
  for (const RopeReferenceCase& ref : kRopeReferenceCases) {
    INFO("case " << ref.name);
    const std::vector<float> inv_freq = rope_inv_freq(config_of(ref));
    REQUIRE(inv_freq.size() == static_cast<std::size_t>(ref.head_dim / 2));
    for (std::size_t i = 0; i < inv_freq.size(); ++i) {
      INFO("i = " << i << " ours " << inv_freq[i] << " transformers " << float_of(ref.inv_freq[i]));
      // Our theta^e is correctly rounded; torch's vectorized pow (SLEEF, 1.0-ulp class) is off
      // by one ulp now and then (1 of 208 values here: qwen3 i = 37). Everything after the pow,
      // llama3 scaling included, is reproduced operation by operation.
      CHECK(ulp_distance(inv_freq[i], float_of(ref.inv_freq[i])) <= 1);
      exact += bits_of(inv_freq[i]) == ref.inv_freq[i];
      ++total;
    }
  }
  CHECK(total - exact <= 2);
}

TEST_CASE("rope inv_freq matches the formulas re-derived in long double", "[rope]") {
  for (const RopeReferenceCase& ref : kRopeReferenceCases) {
    INFO("case " << ref.name);
    const RopeConfig config = config_of(ref);
    const std::vector<float> inv_freq = rope_inv_freq(config);
    for (std::size_t i = 0; i < inv_freq.size(); ++i) {
      long double exact = std::pow(static_cast<long double>(ref.theta),
                                   -2.0L * static_cast<long double>(i) / ref.head_dim);
      if (ref.llama3) exact = llama3_exact(exact, config);
      // torch rounds the exponent 2i/d to fp32 before the pow: d(theta^e)/theta^e = ln(theta)
      // de with |de| <= u, i.e. up to ~14 u for theta = 1e6, plus a few roundings after it.
      const long double tolerance =
          (std::log(static_cast<long double>(ref.theta)) + 8.0L) * kUnitRoundoff * exact;
      INFO("i = " << i);
      CHECK(std::fabs(static_cast<long double>(inv_freq[i]) - exact) <= tolerance);
    }
  }
}

TEST_CASE("rope cos/sin table matches transformers within 1 ulp", "[rope]") {
  for (const RopeReferenceCase& ref : kRopeReferenceCases) {
    INFO("case " << ref.name);
    // transformers' own inv_freq, so this checks the table alone (angle and cos/sin); at
    // position 131071 one ulp of inv_freq would move the angle by far more than an ulp of cos.
    std::vector<float> inv_freq(static_cast<std::size_t>(ref.head_dim / 2));
    for (std::size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = float_of(ref.inv_freq[i]);
    const RopeTable table = make_rope_table(inv_freq, 131072);
    const int half = ref.head_dim / 2;
    int64_t exact = 0;
    int64_t total = 0;
    for (int p = 0; p < kRopeRefNumPositions; ++p) {
      const int64_t pos = kRopeRefPositions[p];
      for (int i = 0; i < half; ++i) {
        const float ours_cos = table.cos[static_cast<std::size_t>(pos * half + i)];
        const float ours_sin = table.sin[static_cast<std::size_t>(pos * half + i)];
        const float ref_cos = float_of(ref.cos[p * half + i]);
        const float ref_sin = float_of(ref.sin[p * half + i]);
        INFO("position " << pos << " i " << i);
        // Same fp32 angle; torch's vectorized cos/sin (SLEEF, 1.0-ulp class) against our
        // correctly rounded ones.
        CHECK(ulp_distance(ours_cos, ref_cos) <= 1);
        CHECK(ulp_distance(ours_sin, ref_sin) <= 1);
        exact += (bits_of(ours_cos) == bits_of(ref_cos)) + (bits_of(ours_sin) == bits_of(ref_sin));
        total += 2;
      }
    }
    // Nearly all must agree exactly; a systematic angle error would break that.
    CHECK(exact * 100 >= total * 95);
  }
}

TEST_CASE("rope config errors are reported, not undefined", "[rope]") {
  RopeConfig bad;
  bad.rotary_dim = 63;
  CHECK_THROWS_AS(rope_inv_freq(bad), std::invalid_argument);
  bad.rotary_dim = 0;
  CHECK_THROWS_AS(rope_inv_freq(bad), std::invalid_argument);
  RopeConfig theta;
  theta.rotary_dim = 64;
  theta.theta = 0.0;
  CHECK_THROWS_AS(rope_inv_freq(theta), std::invalid_argument);
  RopeConfig llama3;
  llama3.rotary_dim = 64;
  llama3.scaling = RopeScaling::llama3;
  llama3.high_freq_factor = llama3.low_freq_factor;  // would divide by zero
  CHECK_THROWS_AS(rope_inv_freq(llama3), std::invalid_argument);
}

namespace {

// Readable reference: rotate_half in double from the same table.
void rope_reference(std::vector<float>& x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
                    int64_t token_stride, int64_t head_offset,
                    const std::vector<int32_t>& positions, const RopeTable& table,
                    std::vector<double>& bound) {
  const int64_t half = table.half_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t base = t * token_stride + head_offset + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double c = table.cos[static_cast<std::size_t>(positions[t] * half + i)];
        const double s = table.sin[static_cast<std::size_t>(positions[t] * half + i)];
        const double x0 = x[base + i];
        const double x1 = x[base + i + half];
        x[base + i] = static_cast<float>(x0 * c - x1 * s);
        x[base + i + half] = static_cast<float>(x1 * c + x0 * s);
        // Two rounded products and a rounded sum in fp32, plus our rounding of the reference.
        bound[base + i] = 3.0 * kUnitRoundoff * (std::fabs(x0 * c) + std::fabs(x1 * s)) + 1e-30;
        bound[base + i + half] =
            3.0 * kUnitRoundoff * (std::fabs(x1 * c) + std::fabs(x0 * s)) + 1e-30;
      }
    }
  }
}

}  // namespace

TEST_CASE("rope_cpu rotates q and k inside a fused qkv row and leaves v alone", "[rope]") {
  const int64_t head_dim = 64, num_q_heads = 9, num_kv_heads = 3, num_tokens = 37;
  const int64_t row = (num_q_heads + 2 * num_kv_heads) * head_dim;  // fused [q | k | v]
  RopeConfig config;
  config.rotary_dim = head_dim;
  config.theta = 100000.0;
  const RopeTable table = make_rope_table(rope_inv_freq(config), 4096);
  std::vector<int32_t> positions(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) positions[t] = static_cast<int32_t>((t * 977) % 4096);

  const std::vector<float> input = random_floats(static_cast<std::size_t>(num_tokens * row), 7);
  std::vector<float> ours = input;
  std::vector<float> expected = input;
  std::vector<double> bound(input.size(), 0.0);
  rope_reference(expected, num_tokens, num_q_heads, head_dim, row, 0, positions, table, bound);
  rope_reference(expected, num_tokens, num_kv_heads, head_dim, row, num_q_heads * head_dim,
                 positions, table, bound);

  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    ours = input;
    RopeParams p;
    p.q = ours.data();
    p.k = ours.data() + num_q_heads * head_dim;
    p.positions = positions.data();
    p.num_tokens = num_tokens;
    p.num_q_heads = num_q_heads;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.q_token_stride = row;
    p.k_token_stride = row;
    rope_cpu(p, table, pool);
    for (std::size_t i = 0; i < ours.size(); ++i) {
      const int64_t col = static_cast<int64_t>(i) % row;
      if (col >= (num_q_heads + num_kv_heads) * head_dim) {
        REQUIRE(bits_of(ours[i]) == bits_of(input[i]));  // v untouched
      } else {
        INFO("element " << i);
        REQUIRE(std::fabs(static_cast<double>(ours[i]) - expected[i]) <= bound[i]);
      }
    }
    // A rotation keeps each pair's norm (to rounding).
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float* in = input.data() + t * row;
      const float* out = ours.data() + t * row;
      double norm_in = 0.0, norm_out = 0.0;
      for (int64_t i = 0; i < head_dim; ++i) {
        norm_in += double(in[i]) * in[i];
        norm_out += double(out[i]) * out[i];
      }
      CHECK(norm_out == Approx(norm_in).epsilon(1e-5));
    }
  }
}

TEST_CASE("rope_cpu: position 0 is the identity, partial rotary keeps the tail", "[rope]") {
  ThreadPool pool(2);
  RopeConfig config;
  config.rotary_dim = 32;  // of a 64-wide head
  const RopeTable table = make_rope_table(rope_inv_freq(config), 16);
  const std::vector<float> input = random_floats(2 * 64, 3);
  std::vector<float> x = input;
  const int32_t positions[2] = {0, 5};
  RopeParams p;
  p.q = x.data();
  p.positions = positions;
  p.num_tokens = 2;
  p.num_q_heads = 1;
  p.head_dim = 64;
  rope_cpu(p, table, pool);
  for (int i = 0; i < 64; ++i) CHECK(bits_of(x[i]) == bits_of(input[i]));  // cos 0 = 1, sin 0 = 0
  for (int i = 32; i < 64; ++i) CHECK(bits_of(x[64 + i]) == bits_of(input[64 + i]));
  bool rotated = false;
  for (int i = 0; i < 32; ++i) rotated |= bits_of(x[64 + i]) != bits_of(input[64 + i]);
  CHECK(rotated);
}

TEST_CASE("rope_cpu rejects positions outside the table", "[rope]") {
  ThreadPool pool(1);
  RopeConfig config;
  config.rotary_dim = 8;
  const RopeTable table = make_rope_table(rope_inv_freq(config), 10);
  std::vector<float> x(8, 1.0f);
  for (int32_t bad : {-1, 10, 1 << 30}) {
    const int32_t positions[1] = {bad};
    RopeParams p;
    p.q = x.data();
    p.positions = positions;
    p.num_tokens = 1;
    p.num_q_heads = 1;
    p.head_dim = 8;
    CHECK_THROWS_AS(rope_cpu(p, table, pool), std::out_of_range);
  }
  RopeParams wide;  // rotary dim 8 does not fit a head of 4
  wide.q = x.data();
  wide.num_tokens = 0;
  wide.num_q_heads = 1;
  wide.head_dim = 4;
  CHECK_THROWS_AS(rope_cpu(wide, table, pool), std::invalid_argument);
}
