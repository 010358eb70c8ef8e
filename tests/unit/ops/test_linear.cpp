// linear_cpu, bf16 and FP8 weights (per channel and 128-input blocks): against a readable
// double-precision loop over the dequantized weights (error bounds derived below), bitwise equal
// across the fp32-dot ISA paths, across thread counts and batch compositions on every path (the
// engine's batch-invariance test depends on it), odd shapes and strides, every E4M3 code.
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/fp8.hpp"
#include "ops_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

namespace {

struct Shape {
  int64_t tokens, in, out;
};

// Odd sizes on purpose: in not a multiple of 16 or 64 (tails of 1..63), out = 1, out not a
// multiple of the register tiles (6, 3, 4 and 8 columns), token counts not multiples of the
// tile rows, in > 128 with a partial last block.
const Shape kShapes[] = {{1, 1, 1},   {1, 15, 7},   {3, 16, 1},   {5, 17, 25},  {7, 33, 13},
                         {9, 576, 64}, {2, 1000, 3}, {13, 1536, 50}, {4, 31, 97}, {130, 40, 9},
                         {1, 4097, 2}, {6, 64, 6},   {1, 320, 37},  {3, 200, 19}};

// How the weights are stored: bf16, or FP8 with one scale per row or per block of 64 / 128.
struct WeightKind {
  WeightDtype dtype;
  int64_t block_k;  // 0: one scale per row
  std::string name() const {
    if (dtype == WeightDtype::bf16) return "bf16";
    return block_k == 0 ? "fp8/channel" : "fp8/block" + std::to_string(block_k);
  }
};
const WeightKind kKinds[] = {{WeightDtype::bf16, 0},
                             {WeightDtype::fp8_e4m3, 0},
                             {WeightDtype::fp8_e4m3, 128},
                             {WeightDtype::fp8_e4m3, 64}};

std::vector<LinearIsa> available_isas() {
  std::vector<LinearIsa> isas = {LinearIsa::scalar};
  for (const LinearIsa isa : {LinearIsa::avx2, LinearIsa::avx512, LinearIsa::avx512bf16}) {
    if (linear_isa_supported(isa)) {
      isas.push_back(isa);
    } else {
      WARN("this CPU lacks the " << linear_isa_name(isa) << " path: not tested on this machine");
    }
  }
  return isas;
}

bool is_bf16_dot(LinearIsa isa) { return isa == LinearIsa::avx512bf16; }

struct Problem {
  Shape shape;
  WeightKind kind;
  std::vector<float> x;
  std::vector<std::uint16_t> w_bf16;
  std::vector<std::uint8_t> w_fp8;
  std::vector<float> scales;  // [out, num_k_blocks]
  std::vector<std::uint16_t> bias;

  int64_t num_k_blocks() const { return weight_num_k_blocks(shape.in, kind.block_k); }
  // The weight the kernel is meant to multiply by: bf16 value, or decode(q) * scale.
  double weight(int64_t o, int64_t k) const {
    if (kind.dtype == WeightDtype::bf16) return bf16_to_float(w_bf16[o * shape.in + k]);
    const int64_t block = kind.block_k == 0 ? shape.in : kind.block_k;
    return static_cast<double>(fp8_e4m3_decode(w_fp8[o * shape.in + k])) *
           scales[o * num_k_blocks() + k / block];
  }
};

// FP8 weights: random codes over the whole E4M3 range (NaN codes excluded), scales spread over
// two decades so blocks of one row differ.
Problem make_problem(const Shape& s, const WeightKind& kind, std::uint32_t seed, bool with_bias) {
  Problem p{s, kind, random_floats(static_cast<std::size_t>(s.tokens * s.in), seed), {}, {}, {}, {}};
  const auto n = static_cast<std::size_t>(s.out * s.in);
  if (kind.dtype == WeightDtype::bf16) {
    p.w_bf16 = random_bf16(n, seed + 1, 0.05f);
  } else {
    std::mt19937 rng(seed + 1);
    p.w_fp8.resize(n);
    for (auto& q : p.w_fp8) {
      do q = static_cast<std::uint8_t>(rng() & 0xff);
      while ((q & 0x7f) == 0x7f);
    }
    p.scales.resize(static_cast<std::size_t>(s.out * p.num_k_blocks()));
    std::uniform_real_distribution<float> exponent(-2.0f, 0.0f);
    for (float& scale : p.scales) scale = std::pow(10.0f, exponent(rng)) / 448.0f;
  }
  if (with_bias) p.bias = random_bf16(static_cast<std::size_t>(s.out), seed + 2, 0.5f);
  return p;
}

LinearParams params_of(const Problem& p, std::vector<float>& y) {
  LinearParams params;
  params.x = p.x.data();
  if (p.kind.dtype == WeightDtype::bf16) {
    params.weight = p.w_bf16.data();
  } else {
    params.weight = p.w_fp8.data();
    params.weight_dtype = WeightDtype::fp8_e4m3;
    params.weight_scales = p.scales.data();
    params.weight_block_k = p.kind.block_k;
  }
  params.bias = p.bias.empty() ? nullptr : p.bias.data();
  params.y = y.data();
  params.num_tokens = p.shape.tokens;
  params.in_features = p.shape.in;
  params.out_features = p.shape.out;
  return params;
}

std::vector<float> run(const Problem& p, ThreadPool& pool, LinearIsa isa = LinearIsa::best) {
  std::vector<float> y(static_cast<std::size_t>(p.shape.tokens * p.shape.out), -7.0f);
  linear_cpu(params_of(p, y), pool, isa);
  return y;
}

// bf16 rounding as the bf16 dot does it (round to nearest even; no denormals occur here).
double round_bf16(float v) { return bf16_to_float(float_to_bf16(v)); }

}  // namespace

TEST_CASE("linear matches the double-precision loop within the summation bound", "[linear]") {
  ThreadPool pool(2);
  for (const LinearIsa isa : available_isas()) {
    for (const WeightKind& kind : kKinds) {
      for (const Shape& s : kShapes) {
        for (const bool with_bias : {false, true}) {
          INFO(linear_isa_name(isa) << " " << kind.name() << " tokens " << s.tokens << " in " << s.in
                                    << " out " << s.out << " bias " << with_bias);
          const Problem p = make_problem(s, kind, 11, with_bias);
          const std::vector<float> y = run(p, pool, isa);
          for (int64_t t = 0; t < s.tokens; ++t) {
            for (int64_t o = 0; o < s.out; ++o) {
              // The references: plain loops, double accumulation (exact products), over x and, for
              // the bf16 dot, over x rounded to bf16 as the kernel is meant to round it.
              double ref = 0.0, ref_rounded = 0.0, magnitude = 0.0;
              for (int64_t k = 0; k < s.in; ++k) {
                const float xk = p.x[t * s.in + k];
                const double w = p.weight(o, k);
                ref += xk * w;
                ref_rounded += round_bf16(xk) * w;
                magnitude += std::fabs(xk * w);
              }
              // Each of 16 lanes sums ceil(block / 16) terms with one rounding each, every block
              // adds one more (its scale's multiply-add), then a 4-level tree: first order,
              // |error| <= (ceil(in / 16) + blocks + 4) u sum|x w|, + u |y| for the bias add.
              double bound = (static_cast<double>((s.in + 15) / 16 + p.num_k_blocks()) + 4.0) *
                             kUnitRoundoff * magnitude * 1.01;
              double loose = bound;
              if (with_bias) {
                const double b = bf16_to_float(p.bias[o]);
                ref += b;
                ref_rounded += b;
                bound += kUnitRoundoff * (std::fabs(ref) + magnitude) * 1.01;
                loose = bound;
              }
              // The bf16 dot rounds each x to bf16: a relative error <= 2^-8 (bf16 keeps 8 significant bits).
              if (is_bf16_dot(isa)) loose += 0x1p-8 * magnitude;
              const double got = y[static_cast<std::size_t>(t * s.out + o)];
              INFO("t " << t << " o " << o << " got " << got << " ref " << ref << " (x in bf16: "
                        << ref_rounded << ") bound " << bound);
              REQUIRE(std::fabs(got - ref) <= loose + 1e-30);
              if (is_bf16_dot(isa)) REQUIRE(std::fabs(got - ref_rounded) <= bound + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("linear: every fp32-dot ISA path gives bitwise the same result", "[linear]") {
  ThreadPool pool(2);
  for (const WeightKind& kind : kKinds) {
    for (const Shape& s : kShapes) {
      const Problem p = make_problem(s, kind, 23, true);
      const std::vector<float> scalar = run(p, pool, LinearIsa::scalar);
      for (const LinearIsa isa : available_isas()) {
        if (is_bf16_dot(isa)) continue;  // its own arithmetic (x rounded to bf16)
        INFO(linear_isa_name(isa) << " " << kind.name() << " tokens " << s.tokens << " in " << s.in
                                  << " out " << s.out);
        CHECK(same_bits(run(p, pool, isa), scalar));
      }
    }
  }
}

TEST_CASE("linear reads every E4M3 code exactly on every path", "[linear]") {
  // Row o holds code (o * 8 + k) at input k: one-hot x picks each code in turn, so y is
  // decode(code) * scale, rounded once, on every path (bf16, FP8 through the fp16 trick or the
  // byte table, every lane position of a 64-input chunk).
  ThreadPool pool(1);
  const Shape s{64, 64, 32};
  Problem p = make_problem(s, {WeightDtype::fp8_e4m3, 0}, 5, false);
  for (int64_t o = 0; o < s.out; ++o) {
    for (int64_t k = 0; k < s.in; ++k) {
      std::uint8_t code = static_cast<std::uint8_t>((o * 8 + k) & 0xff);
      if ((code & 0x7f) == 0x7f) code = 0;  // NaN codes never reach a kernel (the loaders refuse them)
      p.w_fp8[static_cast<std::size_t>(o * s.in + k)] = code;
    }
  }
  std::fill(p.x.begin(), p.x.end(), 0.0f);
  for (int64_t t = 0; t < s.tokens; ++t) p.x[static_cast<std::size_t>(t * s.in + t)] = 1.0f;
  for (const LinearIsa isa : available_isas()) {
    const std::vector<float> y = run(p, pool, isa);
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t o = 0; o < s.out; ++o) {
        const std::uint8_t code = p.w_fp8[static_cast<std::size_t>(o * s.in + t)];
        const float expected = fp8_e4m3_decode(code) * p.scales[static_cast<std::size_t>(o)];
        INFO(linear_isa_name(isa) << " code " << int{code} << " at input " << t);
        REQUIRE(bits_of(y[static_cast<std::size_t>(t * s.out + o)]) == bits_of(expected + 0.0f));
      }
    }
  }
}

TEST_CASE("linear is batch invariant on every path: a row alone equals the same row in any batch",
          "[linear]") {
  ThreadPool pool(2);
  for (const LinearIsa isa : available_isas()) {
    for (const WeightKind& kind : kKinds) {
      for (const Shape& s : {Shape{37, 576, 192}, Shape{11, 100, 31}, Shape{8, 1536, 70}, Shape{9, 320, 13}}) {
        INFO(linear_isa_name(isa) << " " << kind.name() << " in " << s.in << " out " << s.out);
        const Problem all = make_problem(s, kind, 31, true);
        const std::vector<float> batched = run(all, pool, isa);
        // Every window of 1, 2, 3, 5 and 8 rows at every offset: rows land in different tile
        // positions (first / last / partial tile, the batch-1 path) than in the full batch.
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
}

TEST_CASE("linear gives bitwise the same result for any thread count", "[linear]") {
  ThreadPool one(1);
  for (const WeightKind& kind : kKinds) {
    for (const Shape& s : {Shape{1, 576, 1536}, Shape{65, 1536, 576}, Shape{3, 17, 1}}) {
      const Problem p = make_problem(s, kind, 41, false);
      const std::vector<float> reference = run(p, one);
      for (const int threads : {2, 3, 7}) {
        ThreadPool pool(threads);
        INFO(kind.name() << " threads " << threads << " tokens " << s.tokens << " in " << s.in
                         << " out " << s.out);
        CHECK(same_bits(run(p, pool), reference));
      }
    }
  }
}

TEST_CASE("linear honours row strides and writes only its columns", "[linear]") {
  ThreadPool pool(2);
  const Shape s{5, 45, 21};
  for (const WeightKind& kind : kKinds) {
    const Problem dense = make_problem(s, kind, 53, true);
    const std::vector<float> expected = run(dense, pool);
    const int64_t x_stride = 50, y_stride = 30;
    std::vector<float> x(static_cast<std::size_t>(s.tokens * x_stride), 1e30f);  // poison padding
    for (int64_t t = 0; t < s.tokens; ++t) {
      std::copy(dense.x.begin() + t * s.in, dense.x.begin() + (t + 1) * s.in, x.begin() + t * x_stride);
    }
    std::vector<float> y(static_cast<std::size_t>(s.tokens * y_stride), -3.0f);
    LinearParams params = params_of(dense, y);
    params.x = x.data();
    params.x_stride = x_stride;
    params.y_stride = y_stride;
    linear_cpu(params, pool);
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t o = 0; o < y_stride; ++o) {
        const float got = y[static_cast<std::size_t>(t * y_stride + o)];
        INFO(kind.name() << " t " << t << " o " << o);
        if (o < s.out) {
          CHECK(bits_of(got) == bits_of(expected[static_cast<std::size_t>(t * s.out + o)]));
        } else {
          CHECK(got == -3.0f);
        }
      }
    }
  }
}

TEST_CASE("linear rejects bad shapes and scales and runs zero tokens as a no-op", "[linear]") {
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
  for (const LinearIsa isa : {LinearIsa::avx512bf16, LinearIsa::avx512, LinearIsa::avx2}) {
    if (!linear_isa_supported(isa)) CHECK_THROWS_AS(linear_cpu(p, pool, isa), std::runtime_error);
  }

  const std::uint8_t codes[4] = {0x38, 0x38, 0x38, 0x38};  // E4M3 1.0
  const float scales[1] = {0.5f};
  p.weight = codes;
  p.weight_dtype = WeightDtype::fp8_e4m3;
  CHECK_THROWS_AS(linear_cpu(p, pool), std::invalid_argument);  // no scales
  p.weight_scales = scales;
  p.weight_block_k = 32;  // not a multiple of 64
  CHECK_THROWS_AS(linear_cpu(p, pool), std::invalid_argument);
  p.weight_block_k = 0;
  linear_cpu(p, pool);
  CHECK(y[0] == 5.0f);  // (1 + 2 + 3 + 4) * 0.5, exact
}
