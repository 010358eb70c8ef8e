// [gpu] The paged attention's device building blocks against host definitions: the FP8 -> float
// conversion over all 256 codes (bit-identical to kernels/fp8.hpp's decode), bf16 packing, one
// bf16 mma.sync m16n8k16 against a host matrix product (on a GPU this pins down the fragment
// layout the prefill kernel assumes; on the emulator it checks the shuffle emulation of it) and
// the block scan the kernels plan with. On a GPU (test_gpu) the fast paths run, on the emulator
// (test_attention_primitives_gpu_emu) the portable ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/fp8.hpp"
#include "tests/unit/gpu/attention_primitives.hpp"

using namespace fp8serve;

namespace {

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
constexpr bool kEmulated = true;  // the portable paths run: bit-identical NaN too
#else
constexpr bool kEmulated = false;
#endif

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

}  // namespace

TEST_CASE("the attention's FP8 decode matches the host codec for all 256 codes", "[gpu]") {
  if (!have_device()) return;
  const auto device = cuda::attn_test::decode_fp8_codes();
  for (int code = 0; code < 256; ++code) {
    INFO("code 0x" << std::hex << code);
    const float host = fp8_e4m3_decode(static_cast<uint8_t>(code));
    if (std::isnan(host)) {
      // The hardware conversion's NaN is fp16's canonical NaN widened: only NaN-ness is defined.
      float x;
      std::memcpy(&x, &device[static_cast<std::size_t>(code)], sizeof x);
      CHECK(std::isnan(x));
      if (kEmulated) CHECK(device[static_cast<std::size_t>(code)] == bits_of(host));
    } else {
      CHECK(device[static_cast<std::size_t>(code)] == bits_of(host));  // -0, subnormals, 448 included
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

TEST_CASE("mma_bf16_16816 computes A B + C with PTX's fragment layout", "[gpu]") {
  if (!have_device()) return;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<uint16_t> a(256), b(128);
    std::vector<float> c(128);
    for (auto& x : a) x = bf16_encode(dist(rng));
    for (auto& x : b) x = bf16_encode(dist(rng));
    for (auto& x : c) x = dist(rng);
    if (trial == 2) {  // one-hot rows and columns: a misplaced fragment element moves a whole value
      std::fill(a.begin(), a.end(), uint16_t{0});
      for (int r = 0; r < 16; ++r) a[static_cast<std::size_t>(r * 16 + (r * 7) % 16)] = bf16_encode(1.0f + r);
    }
    const std::vector<float> d = cuda::attn_test::mma_16816(a, b, c);
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 8; ++n) {
        double want = c[static_cast<std::size_t>(m * 8 + n)];
        double magnitude = std::abs(want);
        for (int k = 0; k < 16; ++k) {
          const double term = double{bf16_decode(a[static_cast<std::size_t>(m * 16 + k)])} *
                              bf16_decode(b[static_cast<std::size_t>(k * 8 + n)]);
          want += term;
          magnitude += std::abs(term);
        }
        INFO("trial " << trial << " D[" << m << "][" << n << "]");
        // Products of bf16 are exact in fp32; the sum of 17 terms rounds (the tensor cores may
        // truncate): a few fp32 ulps of the terms' magnitude.
        CHECK(std::abs(d[static_cast<std::size_t>(m * 8 + n)] - want) <= 1e-5 * magnitude + 1e-30);
      }
    }
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
