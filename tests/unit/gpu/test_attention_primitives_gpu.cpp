// [gpu] The paged attention's device building blocks against host definitions: the FP8 -> float
// conversions (cvt and the bit trick) over all 256 codes (bit-identical to kernels/fp8.hpp's
// decode), bf16 and f16 packing, one bf16 and one f16 mma.sync m16n8k16 against a host matrix
// product (on a GPU this pins down the fragment layout the prefill and decode kernels assume; on
// the emulator it checks the emulator's mma against the same definition, in every accumulation
// order) and the block scan the kernels plan with. The same kernels run on a GPU (test_gpu) and on the emulator
// (test_attention_primitives_gpu_emu).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cuda/device_runtime.hpp"
#include "kernels/fp8.hpp"
#include "tests/unit/gpu/attention_primitives.hpp"

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
#include "kernels/cuda/launch.hpp"
#endif

using namespace fp8serve;

namespace {

bool have_device() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: [gpu] test skipped");
  return false;
}

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// IEEE binary16 bits -> value (exact in double), written from the format's definition.
double f16_decode(uint16_t h) {
  const int exponent = h >> 10 & 0x1f, mantissa = h & 0x3ff;
  const double sign = h & 0x8000 ? -1.0 : 1.0;
  if (exponent == 0x1f) return mantissa ? NAN : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

}  // namespace

TEST_CASE("the attention's FP8 decodes match the host codec for all 256 codes", "[gpu]") {
  if (!have_device()) return;
  for (bool bits : {false, true}) {
    const auto device = cuda::attn_test::decode_fp8_codes(bits);
    for (int code = 0; code < 256; ++code) {
      INFO((bits ? "bit trick" : "cvt") << ", code 0x" << std::hex << code);
      const float host = fp8_e4m3_decode(static_cast<uint8_t>(code));
      const uint32_t got = device[static_cast<std::size_t>(code)];
      if (std::isnan(host)) {
        // cvt: fp16's canonical NaN (0x7fff, sign dropped), widened to fp32's canonical 0x7fffffff; the bit trick keeps
        // the sign of the code, as the host codec does.
        CHECK(got == (bits ? bits_of(host) : 0x7fffffffu));
      } else {
        CHECK(got == bits_of(host));  // -0, subnormals, 448 included
      }
    }
  }
}

TEST_CASE("pack_bf16x2 rounds like bf16_encode", "[gpu]") {
  if (!have_device()) return;
  std::mt19937 rng(11);
  std::vector<float> a, b;
  for (int i = 0; i < 4096; ++i) {
    uint32_t x = rng(), y = rng();
    if (i % 4 == 0) x = (x & 0xffff0000u) | 0x8000u;  // exact ties
    float fx, fy;
    std::memcpy(&fx, &x, 4);
    std::memcpy(&fy, &y, 4);
    if (std::isnan(fx)) fx = 1.0f;
    if (std::isnan(fy)) fy = -2.0f;
    a.push_back(fx);
    b.push_back(fy);
  }
  const std::vector<uint32_t> packed = cuda::attn_test::pack_bf16_pairs(a, b);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(i << ": " << a[i] << ", " << b[i]);
    CHECK((packed[i] & 0xffffu) == bf16_encode(a[i]));
    CHECK((packed[i] >> 16) == bf16_encode(b[i]));
  }
}

TEST_CASE("cvt_f16x2_f32 rounds to the nearest fp16, ties to even", "[gpu]") {
  if (!have_device()) return;
  std::mt19937 rng(12);
  std::vector<float> a, b;
  for (int i = 0; i < 4096; ++i) {
    // a: magnitudes across fp16's range, subnormals included; b: (k + 1/2) ulps, exact ties
    // between two fp16 values where k has 11 bits at that exponent (and subnormals).
    const float x = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), static_cast<int>(rng() % 40) - 26);
    a.push_back(rng() % 2 ? -x : x);
    b.push_back(std::ldexp(static_cast<float>(rng() % 2048) + 0.5f, static_cast<int>(rng() % 20) - 24));
  }
  a.push_back(70000.0f);  // beyond fp16's largest finite value (65504): rounds to infinity
  b.push_back(-65519.0f);  // below the midpoint to 65536: stays finite
  const std::vector<uint32_t> packed = cuda::attn_test::pack_f16_pairs(a, b);
  for (std::size_t i = 0; i < a.size(); ++i) {
    for (int half = 0; half < 2; ++half) {
      const double x = half == 0 ? a[i] : b[i];
      const auto h = static_cast<uint16_t>(packed[i] >> (16 * half));
      INFO(i << " half " << half << ": " << x << " -> 0x" << std::hex << h);
      const double got = f16_decode(h);
      if (std::abs(x) >= 65520.0) {  // the overflow threshold: half an ulp above 65504
        CHECK(got == (x > 0 ? INFINITY : -INFINITY));
        continue;
      }
      // No fp16 is nearer than the result (its neighbours in magnitude), and a tie went to the even code.
      const uint16_t magnitude = h & 0x7fff, sign = h & 0x8000;
      const double up = f16_decode(static_cast<uint16_t>(sign | (magnitude + 1)));
      const double down = magnitude > 0 ? f16_decode(static_cast<uint16_t>(sign | (magnitude - 1))) : -got;
      CHECK(std::abs(x - got) <= std::abs(x - up));
      CHECK(std::abs(x - got) <= std::abs(x - down));
      if (std::abs(x - got) == std::abs(x - up) || std::abs(x - got) == std::abs(x - down)) CHECK((h & 1) == 0);
    }
  }
}

namespace {

// D = A B + C in double, and the sum of the terms' magnitudes (the rounding scale); A and B are
// bf16 bits, or f16 bits when f16.
void reference_mma(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, const std::vector<float>& c, int m,
                   int n, double& want, double& magnitude, bool f16) {
  auto value = [&](uint16_t bits) { return f16 ? f16_decode(bits) : double{bf16_decode(bits)}; };
  want = c[static_cast<std::size_t>(m * 8 + n)];
  magnitude = std::abs(want);
  for (int k = 0; k < 16; ++k) {
    const double term = value(a[static_cast<std::size_t>(m * 16 + k)]) * value(b[static_cast<std::size_t>(k * 8 + n)]);
    want += term;
    magnitude += std::abs(term);
  }
}

// How many of D's elements are off by more than a few fp32 ulps of the terms' magnitude:
// products of bf16 (or f16) are exact in fp32; the sum of 17 terms rounds, in an order the tensor
// core does not document (the emulator tries each of MmaOrder's).
int mma_misses(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, const std::vector<float>& c,
               const std::vector<float>& d, bool f16 = false) {
  int misses = 0;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      double want = 0.0, magnitude = 0.0;
      reference_mma(a, b, c, m, n, want, magnitude, f16);
      if (std::abs(d[static_cast<std::size_t>(m * 8 + n)] - want) > 1e-5 * magnitude + 1e-30) {
        if (++misses <= 3) UNSCOPED_INFO("D[" << m << "][" << n << "] = " << d[static_cast<std::size_t>(m * 8 + n)] << ", want " << want);
      }
    }
  return misses;
}

struct MmaInputs {
  std::vector<uint16_t> a = std::vector<uint16_t>(256), b = std::vector<uint16_t>(128);
  std::vector<float> c = std::vector<float>(128);
};

// f16: A and B as fp16 bits (finite, |x| in [2^-14, 4), 11 significant bits: what a bf16 input
// could not hold).
MmaInputs random_mma_inputs(std::mt19937& rng, bool one_hot, bool f16 = false) {
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  auto element = [&]() {
    if (!f16) return bf16_encode(dist(rng));
    return static_cast<uint16_t>((rng() & 0x8000u) | ((1 + rng() % 16) << 10) | (rng() & 0x3ffu));
  };
  MmaInputs in;
  for (auto& x : in.a) x = element();
  for (auto& x : in.b) x = element();
  for (auto& x : in.c) x = dist(rng);
  if (one_hot) {  // one-hot rows: a misplaced fragment element moves a whole value
    std::fill(in.a.begin(), in.a.end(), uint16_t{0});
    for (int r = 0; r < 16; ++r)
      in.a[static_cast<std::size_t>(r * 16 + (r * 7) % 16)] =
          f16 ? static_cast<uint16_t>((15 + r / 8) << 10 | (r % 8) << 7) : bf16_encode(1.0f + r);
  }
  return in;
}

std::vector<const char*> mma_orders() {
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
  return {"sequential", "pairwise", "reversed", "wide"};
#else
  return {"the GPU's"};
#endif
}

void use_mma_order(int index) {
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
  fp8serve::emu::set_mma_order(static_cast<fp8serve::emu::MmaOrder>(index));
#else
  (void)index;
#endif
}

}  // namespace

TEST_CASE("mma.sync m16n8k16 (bf16 and f16) computes A B + C with PTX's fragment layout", "[gpu]") {
  if (!have_device()) return;
  const std::vector<const char*> orders = mma_orders();
  for (bool f16 : {false, true}) {
    for (int order = 0; order < static_cast<int>(orders.size()); ++order) {
      use_mma_order(order);
      std::mt19937 rng(5);
      for (int trial = 0; trial < 3; ++trial) {
        const MmaInputs in = random_mma_inputs(rng, trial == 2, f16);
        INFO((f16 ? "f16" : "bf16") << ", accumulation order " << orders[static_cast<std::size_t>(order)] << ", trial "
                                    << trial);
        CHECK(mma_misses(in.a, in.b, in.c, cuda::attn_test::mma_16816(in.a, in.b, in.c, 0, f16), f16) == 0);
      }
    }
  }
  use_mma_order(0);
}

TEST_CASE("a lane that loads one mma fragment register from the wrong row gives a wrong D", "[gpu]") {
  if (!have_device()) return;
  for (bool f16 : {false, true}) {
    std::mt19937 rng(7);
    const MmaInputs in = random_mma_inputs(rng, false, f16);
    CHECK(mma_misses(in.a, in.b, in.c, cuda::attn_test::mma_16816(in.a, in.b, in.c, /*fault=*/1, f16), f16) > 0);
    // Reading f16 inputs as bf16 (or the reverse) is caught too: the MMA's type is pinned down.
    CHECK(mma_misses(in.a, in.b, in.c, cuda::attn_test::mma_16816(in.a, in.b, in.c, 0, !f16), f16) > 0);
  }
}

TEST_CASE("block_exclusive_scan gives the prefix sums for any length", "[gpu]") {
  if (!have_device()) return;
  std::mt19937 rng(3);
  for (int n : {0, 1, 31, 127, 128, 129, 1000, 4096}) {
    std::vector<int> counts(static_cast<std::size_t>(n));
    for (int& x : counts) x = static_cast<int>(rng() % 5);
    const std::vector<int> prefix = cuda::attn_test::block_scan(counts);
    INFO("n = " << n);
    int running = 0;
    for (int i = 0; i < n; ++i) {
      REQUIRE(prefix[static_cast<std::size_t>(i)] == running);
      running += counts[static_cast<std::size_t>(i)];
    }
    CHECK(prefix[static_cast<std::size_t>(n)] == running);
  }
}
