// The per-head Walsh-Hadamard transform of --kv-rotation against its matrix: H_n built by
// Sylvester's recursion (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]) and applied as a
// matrix product in double, block diagonal over the power-of-two segments of a head_dim that is
// not one. The op's fast butterflies must agree with it to fp32 rounding, be orthogonal (norms
// kept, scores q.k kept) and be their own inverse.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "ops_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;
using namespace fp8serve::cpu::test;

namespace {

// Entry (i, j) of Sylvester's Hadamard matrix (of any power-of-two order > i, j): (-1)^popcount(i & j).
double sylvester(int64_t i, int64_t j) {
  return __builtin_popcountll(static_cast<unsigned long long>(i & j)) % 2 ? -1.0 : 1.0;
}

// The reference: each segment (largest power of two first) times H_n / sqrt(n), in double.
std::vector<double> reference_head(const float* x, int64_t head_dim, std::vector<int64_t>* segments = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(head_dim));
  int64_t at = 0;
  while (at < head_dim) {
    int64_t n = 1;
    while (2 * n <= head_dim - at) n *= 2;
    if (segments) segments->push_back(n);
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += sylvester(i, j) * x[at + j];
      out[static_cast<std::size_t>(at + i)] = sum / std::sqrt(static_cast<double>(n));
    }
    at += n;
  }
  return out;
}

void run(std::vector<float>& x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride, int threads = 2) {
  ThreadPool pool(threads);
  HeadHadamardParams p;
  p.x = x.data();
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.token_stride = stride;
  head_hadamard_cpu(p, pool);
}

}  // namespace

TEST_CASE("head_hadamard equals the Sylvester matrix product, to fp32 rounding", "[hadamard]") {
  for (const int64_t head_dim : {1, 2, 16, 64, 128, 256}) {
    INFO("head_dim " << head_dim);
    const int64_t tokens = 5, heads = 3;
    const std::vector<float> in = random_floats(static_cast<std::size_t>(tokens * heads * head_dim), 7, 3.0f);
    std::vector<float> x = in;
    run(x, tokens, heads, head_dim, 0);
    double worst = 0;
    for (int64_t r = 0; r < tokens * heads; ++r) {
      const std::vector<double> want = reference_head(in.data() + r * head_dim, head_dim);
      double norm = 0;
      for (const double v : want) norm = std::max(norm, std::abs(v));
      for (int64_t i = 0; i < head_dim; ++i)
        worst = std::max(worst, std::abs(x[static_cast<std::size_t>(r * head_dim + i)] - want[static_cast<std::size_t>(i)]) / norm);
    }
    // log2(n) + 1 roundings of values no larger than the head's norm: a few ulps of it.
    CHECK(worst < 4e-6);
  }
}

TEST_CASE("head_hadamard: a head_dim that is not a power of two is cut into segments", "[hadamard]") {
  for (const int64_t head_dim : {96, 80, 40, 7}) {
    INFO("head_dim " << head_dim);
    const std::vector<float> in = random_floats(static_cast<std::size_t>(2 * head_dim), 11, 2.0f);
    std::vector<float> x = in;
    run(x, 2, 1, head_dim, 0);
    std::vector<int64_t> segments;
    for (int64_t t = 0; t < 2; ++t) {
      segments.clear();
      const std::vector<double> want = reference_head(in.data() + t * head_dim, head_dim, &segments);
      for (int64_t i = 0; i < head_dim; ++i)
        CHECK(x[static_cast<std::size_t>(t * head_dim + i)] == Approx(want[static_cast<std::size_t>(i)]).margin(1e-5));
    }
    int64_t sum = 0;
    for (const int64_t n : segments) {
      CHECK((n & (n - 1)) == 0);
      sum += n;
    }
    CHECK(sum == head_dim);
    if (head_dim == 96) CHECK(segments == std::vector<int64_t>{64, 32});
    if (head_dim == 7) CHECK(segments == std::vector<int64_t>{4, 2, 1});
  }
}

TEST_CASE("head_hadamard is orthogonal and its own inverse: scores and norms are kept", "[hadamard]") {
  const int64_t head_dim = 64;
  const std::vector<float> q = random_floats(head_dim, 21, 4.0f);
  const std::vector<float> k = random_floats(head_dim, 22, 4.0f);
  std::vector<float> hq = q, hk = k;
  run(hq, 1, 1, head_dim, 0);
  run(hk, 1, 1, head_dim, 0);
  double dot = 0, hdot = 0, norm = 0, hnorm = 0;
  for (int64_t i = 0; i < head_dim; ++i) {
    dot += double(q[i]) * k[i];
    hdot += double(hq[i]) * hk[i];
    norm += double(q[i]) * q[i];
    hnorm += double(hq[i]) * hq[i];
  }
  CHECK(hdot == Approx(dot).margin(1e-4));
  CHECK(hnorm == Approx(norm).epsilon(1e-6));
  std::vector<float> back = hq;
  run(back, 1, 1, head_dim, 0);
  for (int64_t i = 0; i < head_dim; ++i) CHECK(back[i] == Approx(q[i]).margin(1e-5));
  // An outlier channel is spread over all of them: amax falls to 1/sqrt(64) of a lone spike.
  std::vector<float> spike(head_dim, 0.0f);
  spike[5] = 8.0f;
  run(spike, 1, 1, head_dim, 0);
  for (const float v : spike) CHECK(std::abs(v) == 1.0f);
}

TEST_CASE("head_hadamard touches only its heads: q|k|v slices of a fused row, any thread count", "[hadamard]") {
  // 9 q heads + 3 k heads rotated inside rows of 15 heads (v left alone), head_dim 64.
  const int64_t head_dim = 64, row = 15 * head_dim, tokens = 37;
  const std::vector<float> in = random_floats(static_cast<std::size_t>(tokens * row), 31, 2.0f);
  std::vector<float> one = in, many = in;
  run(one, tokens, 12, head_dim, row, 1);
  run(many, tokens, 12, head_dim, row, 4);
  CHECK(one == many);  // batch invariant and thread-count invariant, bit for bit
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 12 * head_dim; i < row; ++i) CHECK(one[static_cast<std::size_t>(t * row + i)] == in[static_cast<std::size_t>(t * row + i)]);
    const std::vector<double> want = reference_head(in.data() + t * row + 4 * head_dim, head_dim);
    CHECK(one[static_cast<std::size_t>(t * row + 4 * head_dim + 9)] == Approx(want[9]).margin(1e-5));
  }
  HeadHadamardParams bad;
  bad.head_dim = 0;
  ThreadPool pool(1);
  CHECK_THROWS_AS(head_hadamard_cpu(bad, pool), std::invalid_argument);
}
