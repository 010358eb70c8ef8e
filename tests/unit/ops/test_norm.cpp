// RMSNorm (whole rows and Qwen3's per-head q/k norm) against a readable double-precision loop.
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"
#include "ops_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

namespace {

// The reference: out = w * x / sqrt(mean(x^2) + eps), all in double.
double rms_reference(const float* x, const std::uint16_t* w, int64_t dim, float eps, int64_t i) {
  double sum = 0.0;
  for (int64_t k = 0; k < dim; ++k) sum += static_cast<double>(x[k]) * x[k];
  return bf16_to_float(w[i]) * (x[i] / std::sqrt(sum / static_cast<double>(dim) + eps));
}

// fp32 error: the sum of squares (positive terms) in 16 lanes of ceil(dim / 16) adds plus a
// 4-level tree, relative (dim / 16 + 6) u; halved by the sqrt; then the division, the
// reciprocal, two products: (dim / 32 + 8) u relative, doubled for margin.
double rms_bound(int64_t dim, double ref) {
  return 2.0 * (static_cast<double>(dim) / 32.0 + 8.0) * kUnitRoundoff * std::fabs(ref) + 1e-30;
}

}  // namespace

TEST_CASE("rms_norm matches the double-precision reference", "[norm]") {
  for (const int64_t dim : {1, 7, 16, 33, 576, 2048, 4099}) {
    const int64_t num_tokens = 5;
    const std::vector<float> x = random_floats(static_cast<std::size_t>(num_tokens * dim), 3, 2.0f);
    const std::vector<std::uint16_t> w = random_bf16(static_cast<std::size_t>(dim), 4);
    std::vector<float> out(x.size());
    ThreadPool pool(2);
    RmsNormParams p;
    p.x = x.data();
    p.weight = w.data();
    p.out = out.data();
    p.num_tokens = num_tokens;
    p.dim = dim;
    p.eps = 1e-5f;
    rms_norm_cpu(p, pool);
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        const double ref = rms_reference(x.data() + t * dim, w.data(), dim, p.eps, i);
        INFO("dim " << dim << " t " << t << " i " << i);
        REQUIRE(std::fabs(out[static_cast<std::size_t>(t * dim + i)] - ref) <= rms_bound(dim, ref));
      }
    }
  }
}

TEST_CASE("rms_norm: eps matters for tiny rows, zero rows give zeros, in place works", "[norm]") {
  ThreadPool pool(1);
  const std::vector<std::uint16_t> w(8, float_to_bf16(1.0f));
  std::vector<float> x(8, 1e-4f);
  RmsNormParams p;
  p.x = x.data();
  p.weight = w.data();
  p.out = x.data();  // in place
  p.num_tokens = 1;
  p.dim = 8;
  p.eps = 1e-6f;
  rms_norm_cpu(p, pool);
  // mean(x^2) = 1e-8, so x / sqrt(1e-8 + 1e-6) = 1e-4 / sqrt(1.01e-6) = 0.0995037...
  for (float v : x) CHECK(v == Approx(0.09950372).epsilon(1e-5));
  std::fill(x.begin(), x.end(), 0.0f);
  rms_norm_cpu(p, pool);
  for (float v : x) CHECK(v == 0.0f);
}

TEST_CASE("per-head rms_norm (Qwen3 q/k norm) on a slice of a fused qkv row", "[norm]") {
  const int64_t head_dim = 128, num_heads = 4, num_tokens = 9;
  const int64_t row = 3 * num_heads * head_dim;  // q | k | v, norm only the q part
  const std::vector<float> x = random_floats(static_cast<std::size_t>(num_tokens * row), 5, 3.0f);
  const std::vector<std::uint16_t> w = random_bf16(static_cast<std::size_t>(head_dim), 6);
  for (const int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    std::vector<float> y = x;
    RmsNormParams p;
    p.x = y.data();
    p.weight = w.data();
    p.out = y.data();
    p.num_tokens = num_tokens;
    p.num_heads = num_heads;
    p.dim = head_dim;
    p.x_token_stride = row;
    p.out_token_stride = row;
    p.eps = 1e-6f;
    rms_norm_cpu(p, pool);
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t c = 0; c < row; ++c) {
        const std::size_t at = static_cast<std::size_t>(t * row + c);
        if (c >= num_heads * head_dim) {
          REQUIRE(bits_of(y[at]) == bits_of(x[at]));  // k and v untouched
          continue;
        }
        const int64_t head = c / head_dim;
        const double ref = rms_reference(x.data() + t * row + head * head_dim, w.data(), head_dim,
                                         p.eps, c % head_dim);
        INFO("threads " << threads << " t " << t << " c " << c);
        REQUIRE(std::fabs(y[at] - ref) <= rms_bound(head_dim, ref));
      }
    }
  }
}

TEST_CASE("rms_norm rows do not depend on the batch or the thread count", "[norm]") {
  const int64_t dim = 576, num_tokens = 33;
  const std::vector<float> x = random_floats(static_cast<std::size_t>(num_tokens * dim), 8);
  const std::vector<std::uint16_t> w = random_bf16(static_cast<std::size_t>(dim), 9);
  auto run = [&](int threads, int64_t first, int64_t count) {
    ThreadPool pool(threads);
    std::vector<float> out(static_cast<std::size_t>(count * dim));
    RmsNormParams p;
    p.x = x.data() + first * dim;
    p.weight = w.data();
    p.out = out.data();
    p.num_tokens = count;
    p.dim = dim;
    rms_norm_cpu(p, pool);
    return out;
  };
  const std::vector<float> all = run(1, 0, num_tokens);
  CHECK(same_bits(run(3, 0, num_tokens), all));
  const std::vector<float> one = run(2, 17, 1);
  CHECK(same_bits(one, std::vector<float>(all.begin() + 17 * dim, all.begin() + 18 * dim)));
}

TEST_CASE("rms_norm rejects bad shapes", "[norm]") {
  ThreadPool pool(1);
  RmsNormParams p;
  p.num_tokens = 1;
  p.dim = 0;
  CHECK_THROWS_AS(rms_norm_cpu(p, pool), std::invalid_argument);
  p.dim = 4;
  p.num_heads = 0;
  CHECK_THROWS_AS(rms_norm_cpu(p, pool), std::invalid_argument);
}

TEST_CASE("rms_norm fused with the residual add is bitwise residual_add then rms_norm", "[norm]") {
  ThreadPool pool(2);
  const int64_t num_tokens = 7, dim = 576, stride = dim + 64;  // residual rows packed, x/out strided
  const std::vector<float> x = random_floats(static_cast<std::size_t>(num_tokens * stride), 11, 0.5f);
  const std::vector<float> residual0 = random_floats(static_cast<std::size_t>(num_tokens * dim), 12, 2.0f);
  const std::vector<std::uint16_t> w = random_bf16(static_cast<std::size_t>(dim), 13);

  // Unfused: residual += x row by row, then the norm of the residual.
  std::vector<float> expected_residual = residual0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    ResidualAddParams add;
    add.residual = expected_residual.data() + t * dim;
    add.x = x.data() + t * stride;
    add.num_elements = dim;
    residual_add_cpu(add, pool);
  }
  std::vector<float> expected_out(static_cast<std::size_t>(num_tokens * stride), -1.0f);
  RmsNormParams plain;
  plain.x = expected_residual.data();
  plain.weight = w.data();
  plain.out = expected_out.data();
  plain.num_tokens = num_tokens;
  plain.dim = dim;
  plain.out_token_stride = stride;
  rms_norm_cpu(plain, pool);

  SECTION("separate output") {
    std::vector<float> residual = residual0;
    std::vector<float> out(expected_out.size(), -1.0f);
    RmsNormParams fused = plain;
    fused.x = x.data();
    fused.x_token_stride = stride;
    fused.residual = residual.data();
    fused.out = out.data();
    rms_norm_cpu(fused, pool);
    CHECK(same_bits(residual, expected_residual));
    CHECK(same_bits(out, expected_out));
  }
  SECTION("out aliases x (the block's output is overwritten by the norm)") {
    std::vector<float> residual = residual0;
    std::vector<float> inout = x;
    RmsNormParams fused = plain;
    fused.x = inout.data();
    fused.x_token_stride = stride;
    fused.residual = residual.data();
    fused.out = inout.data();
    rms_norm_cpu(fused, pool);
    CHECK(same_bits(residual, expected_residual));
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        REQUIRE(bits_of(inout[static_cast<std::size_t>(t * stride + i)]) ==
                bits_of(expected_out[static_cast<std::size_t>(t * stride + i)]));
      }
    }
  }
}
