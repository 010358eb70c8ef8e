// linear_cpu: against a readable double-precision loop (error bound derived below), bitwise
// equal across ISA paths, thread counts and batch compositions (the engine's batch-invariance
// test depends on it), odd shapes and strides.
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/linear.hpp"
#include "ops_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

namespace {

struct Shape {
  int64_t tokens, in, out;
};

// Odd sizes on purpose: in not a multiple of 16 (tails of 1..15), out = 1, out not a multiple of
// the register tile (6 on AVX-512, 3 on AVX2), token counts not multiples of the tile rows.
const Shape kShapes[] = {{1, 1, 1},   {1, 15, 7},   {3, 16, 1},   {5, 17, 25},
                         {7, 33, 13}, {9, 576, 64}, {2, 1000, 3}, {13, 1536, 50},
                         {4, 31, 97}, {130, 40, 9}, {1, 4097, 2}, {6, 64, 6}};

std::vector<LinearIsa> available_isas() {
  std::vector<LinearIsa> isas = {LinearIsa::scalar};
  const CpuFeatures& f = cpu_features();
  if (f.avx2 && f.fma)
    isas.push_back(LinearIsa::avx2);
  else
    WARN("no AVX2+FMA: the avx2 path is not tested on this machine");
  if (f.avx512f && f.avx512bw && f.avx2 && f.fma)
    isas.push_back(LinearIsa::avx512);
  else
    WARN("no AVX-512: the avx512 path is not tested on this machine");
  return isas;
}

struct Problem {
  Shape shape;
  std::vector<float> x;
  std::vector<std::uint16_t> w;
  std::vector<std::uint16_t> bias;
};

Problem make_problem(const Shape& s, std::uint32_t seed, bool with_bias) {
  Problem p{s,
            random_floats(static_cast<std::size_t>(s.tokens * s.in), seed),
            random_bf16(static_cast<std::size_t>(s.out * s.in), seed + 1, 0.05f),
            {}};
  if (with_bias) p.bias = random_bf16(static_cast<std::size_t>(s.out), seed + 2, 0.5f);
  return p;
}

std::vector<float> run(const Problem& p, ThreadPool& pool, LinearIsa isa = LinearIsa::best) {
  std::vector<float> y(static_cast<std::size_t>(p.shape.tokens * p.shape.out), -7.0f);
  LinearParams params;
  params.x = p.x.data();
  params.weight = p.w.data();
  params.bias = p.bias.empty() ? nullptr : p.bias.data();
  params.y = y.data();
  params.num_tokens = p.shape.tokens;
  params.in_features = p.shape.in;
  params.out_features = p.shape.out;
  linear_cpu(params, pool, isa);
  return y;
}

}  // namespace

TEST_CASE("linear matches the double-precision loop within the fp32 summation bound", "[linear]") {
  ThreadPool pool(2);
  for (const LinearIsa isa : available_isas()) {
    for (const Shape& s : kShapes) {
      for (const bool with_bias : {false, true}) {
        INFO(linear_isa_name(isa) << " tokens " << s.tokens << " in " << s.in << " out " << s.out
                                  << " bias " << with_bias);
        const Problem p = make_problem(s, 11, with_bias);
        const std::vector<float> y = run(p, pool, isa);
        for (int64_t t = 0; t < s.tokens; ++t) {
          for (int64_t o = 0; o < s.out; ++o) {
            // The reference: plain loop, double accumulation (exact products of fp32 x bf16).
            double ref = 0.0;
            double magnitude = 0.0;
            for (int64_t k = 0; k < s.in; ++k) {
              const double term =
                  static_cast<double>(p.x[t * s.in + k]) * bf16_to_float(p.w[o * s.in + k]);
              ref += term;
              magnitude += std::fabs(term);
            }
            // Each of 16 lanes sums ceil(in / 16) fused terms in sequence, then a 4-level tree:
            // |error| <= (ceil(in / 16) + 4) u sum|x w| (first order), + u |y| for the bias add.
            double bound =
                (static_cast<double>((s.in + 15) / 16) + 4.0) * kUnitRoundoff * magnitude;
            if (with_bias) {
              ref += bf16_to_float(p.bias[o]);
              bound += kUnitRoundoff * std::fabs(ref) * 1.01;
            }
            const float got = y[static_cast<std::size_t>(t * s.out + o)];
            INFO("t " << t << " o " << o << " got " << got << " ref " << ref);
            REQUIRE(std::fabs(static_cast<double>(got) - ref) <= bound + 1e-30);
          }
        }
      }
    }
  }
}

TEST_CASE("linear: every ISA path gives bitwise the same result", "[linear]") {
  ThreadPool pool(2);
  const std::vector<LinearIsa> isas = available_isas();
  for (const Shape& s : kShapes) {
    const Problem p = make_problem(s, 23, true);
    const std::vector<float> scalar = run(p, pool, LinearIsa::scalar);
    for (const LinearIsa isa : isas) {
      INFO(linear_isa_name(isa) << " tokens " << s.tokens << " in " << s.in << " out " << s.out);
      CHECK(same_bits(run(p, pool, isa), scalar));
    }
  }
}

TEST_CASE("linear is batch invariant: a row alone equals the same row in any batch", "[linear]") {
  ThreadPool pool(2);
  for (const LinearIsa isa : available_isas()) {
    for (const Shape& s : {Shape{37, 576, 192}, Shape{11, 100, 31}, Shape{8, 1536, 70}}) {
      INFO(linear_isa_name(isa) << " in " << s.in << " out " << s.out);
      const Problem all = make_problem(s, 31, true);
      const std::vector<float> batched = run(all, pool, isa);
      // Every window of 1, 2, 3, 5 and 8 rows at every offset: rows land in different tile
      // positions (first / last / partial tile) than in the full batch.
      for (const int64_t window : {1, 2, 3, 5, 8}) {
        for (int64_t start = 0; start + window <= s.tokens; ++start) {
          Problem part = all;
          part.shape.tokens = window;
          part.x.assign(all.x.begin() + start * s.in, all.x.begin() + (start + window) * s.in);
          const std::vector<float> y = run(part, pool, isa);
          const std::vector<float> expect(batched.begin() + start * s.out,
                                          batched.begin() + (start + window) * s.out);
          INFO("window " << window << " start " << start);
          REQUIRE(same_bits(y, expect));
        }
      }
    }
  }
}

TEST_CASE("linear gives bitwise the same result for any thread count", "[linear]") {
  ThreadPool one(1);
  for (const Shape& s : {Shape{1, 576, 1536}, Shape{65, 1536, 576}, Shape{3, 17, 1}}) {
    const Problem p = make_problem(s, 41, false);
    const std::vector<float> reference = run(p, one);
    for (const int threads : {2, 3, 7}) {
      ThreadPool pool(threads);
      INFO("threads " << threads << " tokens " << s.tokens << " in " << s.in << " out " << s.out);
      CHECK(same_bits(run(p, pool), reference));
    }
  }
}

TEST_CASE("linear honours row strides and writes only its columns", "[linear]") {
  ThreadPool pool(2);
  const Shape s{5, 45, 21};
  const Problem dense = make_problem(s, 53, true);
  const std::vector<float> expected = run(dense, pool);
  const int64_t x_stride = 50, y_stride = 30;
  std::vector<float> x(static_cast<std::size_t>(s.tokens * x_stride), 1e30f);  // poison padding
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::copy(dense.x.begin() + t * s.in, dense.x.begin() + (t + 1) * s.in,
              x.begin() + t * x_stride);
  }
  std::vector<float> y(static_cast<std::size_t>(s.tokens * y_stride), -3.0f);
  LinearParams params;
  params.x = x.data();
  params.weight = dense.w.data();
  params.bias = dense.bias.data();
  params.y = y.data();
  params.num_tokens = s.tokens;
  params.in_features = s.in;
  params.out_features = s.out;
  params.x_stride = x_stride;
  params.y_stride = y_stride;
  linear_cpu(params, pool);
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t o = 0; o < y_stride; ++o) {
      const float got = y[static_cast<std::size_t>(t * y_stride + o)];
      if (o < s.out) {
        CHECK(bits_of(got) == bits_of(expected[static_cast<std::size_t>(t * s.out + o)]));
      } else {
        CHECK(got == -3.0f);
      }
    }
  }
}

TEST_CASE("linear rejects bad shapes and runs zero tokens as a no-op", "[linear]") {
  ThreadPool pool(1);
  float x[4] = {1, 2, 3, 4};
  std::uint16_t w[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
  float y[4] = {5, 5, 5, 5};
  LinearParams p;
  p.x = x;
  p.weight = w;
  p.y = y;
  p.num_tokens = 1;
  p.in_features = 0;
  p.out_features = 1;
  CHECK_THROWS_AS(linear_cpu(p, pool), std::invalid_argument);
  p.in_features = 4;
  p.x_stride = 2;  // smaller than a row
  CHECK_THROWS_AS(linear_cpu(p, pool), std::invalid_argument);
  p.x_stride = 0;
  p.num_tokens = 0;
  linear_cpu(p, pool);
  CHECK(y[0] == 5.0f);
  p.num_tokens = 1;
  linear_cpu(p, pool);
  CHECK(y[0] == 10.0f);  // 1 + 2 + 3 + 4, exact
  if (!cpu_features().avx512f || !cpu_features().avx512bw) {
    CHECK_THROWS_AS(linear_cpu(p, pool, LinearIsa::avx512), std::runtime_error);
  }
}
