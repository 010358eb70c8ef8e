// SiLU·mul, embedding lookup, bias and residual adds, row gather and argmax against readable
// loops; hostile indices are errors, not crashes.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"
#include "ops_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

TEST_CASE("bf16 conversions round to nearest even and keep NaN", "[elementwise]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(float_of(0x3f808000u)) == 0x3f80);  // tie, even stays
  CHECK(float_to_bf16(float_of(0x3f818000u)) == 0x3f82);  // tie, odd rounds up
  CHECK(float_to_bf16(float_of(0x3f808001u)) == 0x3f81);  // above the tie
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(float_of(0x7f800001u)))));  // low-bit NaN stays NaN
  for (std::uint32_t b = 0; b < 0x10000u; b += 7) {
    const std::uint16_t bits = static_cast<std::uint16_t>(b);
    if (std::isnan(bf16_to_float(bits))) continue;
    CHECK(float_to_bf16(bf16_to_float(bits)) == bits);  // every bf16 round-trips
  }
}

TEST_CASE("silu_mul matches g / (1 + exp(-g)) * u, fused gate_up layout", "[elementwise]") {
  const int64_t dim = 1536 + 5, num_tokens = 7;
  const std::vector<float> gate_up =
      random_floats(static_cast<std::size_t>(num_tokens * 2 * dim), 12, 4.0f);
  std::vector<float> out(static_cast<std::size_t>(num_tokens * dim));
  ThreadPool pool(3);
  SiluMulParams p;
  p.gate = gate_up.data();
  p.up = gate_up.data() + dim;
  p.out = out.data();
  p.num_tokens = num_tokens;
  p.dim = dim;
  p.gate_token_stride = 2 * dim;
  p.up_token_stride = 2 * dim;
  silu_mul_cpu(p, pool);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < dim; ++i) {
      const double g = gate_up[static_cast<std::size_t>(t * 2 * dim + i)];
      const double u = gate_up[static_cast<std::size_t>(t * 2 * dim + dim + i)];
      const double ref = g / (1.0 + std::exp(-g)) * u;
      // expf within 1 ulp, then add, divide, multiply: a few u relative.
      INFO("t " << t << " i " << i);
      REQUIRE(std::fabs(out[static_cast<std::size_t>(t * dim + i)] - ref) <=
              6 * kUnitRoundoff * std::fabs(ref) + 1e-37);
    }
  }
  // Extremes: silu saturates to 0 and to g without NaN.
  float g2[3] = {-200.0f, 200.0f, 0.0f};
  float u2[3] = {1.0f, 1.0f, 5.0f};
  float o2[3];
  SiluMulParams q;
  q.gate = g2;
  q.up = u2;
  q.out = o2;
  q.num_tokens = 1;
  q.dim = 3;
  silu_mul_cpu(q, pool);
  CHECK(o2[0] == Approx(0.0).margin(1e-30));
  CHECK(o2[1] == 200.0f);
  CHECK(o2[2] == 0.0f);
}

TEST_CASE("embedding copies bf16 rows exactly and rejects bad token ids", "[elementwise]") {
  const int64_t vocab = 100, hidden = 37;
  const std::vector<std::uint16_t> table =
      random_bf16(static_cast<std::size_t>(vocab * hidden), 21);
  const std::vector<int32_t> ids = {5, 0, 99, 5, 42};
  std::vector<float> out(ids.size() * hidden);
  ThreadPool pool(2);
  EmbeddingParams p;
  p.table = table.data();
  p.token_ids = ids.data();
  p.out = out.data();
  p.num_tokens = static_cast<int64_t>(ids.size());
  p.vocab_size = vocab;
  p.hidden = hidden;
  embedding_cpu(p, pool);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (int64_t i = 0; i < hidden; ++i) {
      REQUIRE(bits_of(out[t * hidden + i]) ==
              static_cast<std::uint32_t>(table[static_cast<std::size_t>(ids[t] * hidden + i)])
                  << 16);
    }
  }
  for (const int32_t bad : {-1, 100, std::numeric_limits<int32_t>::max()}) {
    std::vector<int32_t> hostile = {1, bad};
    std::vector<float> untouched(2 * hidden, 7.0f);
    p.token_ids = hostile.data();
    p.out = untouched.data();
    p.num_tokens = 2;
    CHECK_THROWS_AS(embedding_cpu(p, pool), std::out_of_range);
    CHECK(untouched[0] == 7.0f);  // nothing written before the check
  }
}

TEST_CASE("residual_add", "[elementwise]") {
  ThreadPool pool(2);
  const std::size_t big = 200003;  // several chunks on the pool
  std::vector<float> residual = random_floats(big, 33);
  const std::vector<float> delta = random_floats(big, 34);
  const std::vector<float> r0 = residual;
  residual_add_cpu({.residual = residual.data(), .x = delta.data(), .num_elements = int64_t{big}},
                   pool);
  for (std::size_t i = 0; i < big; ++i) REQUIRE(bits_of(residual[i]) == bits_of(r0[i] + delta[i]));
}

TEST_CASE("gather_rows picks sampling rows and rejects bad indices", "[elementwise]") {
  const std::vector<float> x = random_floats(5 * 4, 41);
  const int32_t rows[3] = {4, 0, 4};
  std::vector<float> out(3 * 4);
  GatherRowsParams p{
      .x = x.data(), .rows = rows, .out = out.data(), .num_x_rows = 5, .num_rows = 3, .dim = 4};
  gather_rows_cpu(p);
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 4; ++j)
      CHECK(out[static_cast<std::size_t>(i * 4 + j)] ==
            x[static_cast<std::size_t>(rows[i] * 4 + j)]);
  }
  const int32_t bad[1] = {5};
  p.rows = bad;
  p.num_rows = 1;
  CHECK_THROWS_AS(gather_rows_cpu(p), std::out_of_range);
}

TEST_CASE("argmax_rows follows torch.argmax: first maximum, NaN wins", "[elementwise]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {
      1,    3,    3,   2,                     // tie: first
      -inf, -inf, -5,  -inf, 0, nan, 9, nan,  // first NaN
      inf,  1,    inf, 0,
  };
  int32_t out[4];
  argmax_rows_cpu(logits.data(), 4, 4, out);
  CHECK(out[0] == 1);
  CHECK(out[1] == 2);
  CHECK(out[2] == 1);
  CHECK(out[3] == 0);
  // Against a plain loop on random rows.
  const int64_t vocab = 49152;
  const std::vector<float> big = random_floats(static_cast<std::size_t>(3 * vocab), 51);
  int32_t got[3];
  argmax_rows_cpu(big.data(), 3, vocab, got);
  for (int r = 0; r < 3; ++r) {
    int64_t best = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (big[static_cast<std::size_t>(r * vocab + i)] >
          big[static_cast<std::size_t>(r * vocab + best)])
        best = i;
    }
    CHECK(got[r] == best);
  }
}
