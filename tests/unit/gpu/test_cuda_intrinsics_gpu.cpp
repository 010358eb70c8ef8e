// [gpu] Intrinsics with exact results against plain host loops written from the CUDA Math API's
// definitions: on a GPU (test_gpu) they check the hardware, on the emulator
// (test_cuda_intrinsics_gpu_emu) its device_functions.hpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/device_runtime.hpp"
#include "tests/unit/gpu/cuda_intrinsics.hpp"

using namespace fp8serve;
using namespace fp8serve::cuda::intrinsics;

namespace {

bool have_gpu() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: [gpu] test skipped");
  return false;
}

uint32_t bit(uint64_t x, int i) { return static_cast<uint32_t>((x >> i) & 1u); }

uint32_t popcount(uint64_t x) {
  uint32_t n = 0;
  for (int i = 0; i < 64; ++i) n += bit(x, i);
  return n;
}

uint32_t leading_zeros(uint64_t x, int bits) {
  uint32_t n = 0;
  for (int i = bits - 1; i >= 0 && bit(x, i) == 0; --i) ++n;
  return n;
}

uint32_t first_set(uint64_t x, int bits) {  // 1-based, 0 when none
  for (int i = 0; i < bits; ++i)
    if (bit(x, i) != 0) return static_cast<uint32_t>(i + 1);
  return 0;
}

// The high 64 bits of a 64 x 64-bit product, by schoolbook multiplication in 16-bit digits.
uint64_t high_product(uint64_t x, uint64_t y) {
  uint32_t digits[8] = {};
  for (int i = 0; i < 4; ++i) {
    uint64_t carry = 0;
    for (int j = 0; j < 4; ++j) {
      const uint64_t t = ((x >> (16 * i)) & 0xffff) * ((y >> (16 * j)) & 0xffff) + digits[i + j] + carry;
      digits[i + j] = static_cast<uint32_t>(t & 0xffff);
      carry = t >> 16;
    }
    digits[i + 4] = static_cast<uint32_t>(carry);
  }
  uint64_t high = 0;
  for (int k = 7; k >= 4; --k) high = (high << 16) | digits[k];
  return high;
}

int round_half_even(float f) {
  const double floor = std::floor(static_cast<double>(f)), rest = static_cast<double>(f) - floor;
  const long long down = static_cast<long long>(floor);
  if (rest > 0.5 || (rest == 0.5 && down % 2 != 0)) return static_cast<int>(down + 1);
  return static_cast<int>(down);
}

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::vector<uint32_t> expected(uint32_t a, uint32_t b) {
  std::vector<uint32_t> r(kNumResults);
  const uint64_t wide_a = (uint64_t{a} << 32) | b, wide_b = (uint64_t{b} << 32) | a;
  const float f = static_cast<float>(static_cast<int32_t>(a) / 256) / 4.0f;
  r[kPopc] = popcount(a);
  r[kClz] = leading_zeros(a, 32);
  r[kFfs] = first_set(a, 32);
  for (int i = 0; i < 32; ++i) r[kBrev] |= bit(a, i) << (31 - i);
  // Byte n of the result is byte (selector nibble n) of the eight bytes b:a, a the low four.
  const uint64_t bytes = (uint64_t{b} << 32) | a;
  for (int n = 0; n < 4; ++n) {
    const int selector = static_cast<int>((b >> (4 * n)) & 0x7u);
    r[kBytePerm] |= static_cast<uint32_t>((bytes >> (8 * selector)) & 0xff) << (8 * n);
  }
  // Funnel shifts of the 64 bits b:a by b & 31: the high word after shifting left, the low word
  // after shifting right.
  r[kFunnelLeft] = static_cast<uint32_t>((bytes << (b & 31)) >> 32);
  r[kFunnelRight] = static_cast<uint32_t>(bytes >> (b & 31));
  r[kUmulhi] = static_cast<uint32_t>((uint64_t{a} * b) >> 32);
  r[kMulhi] = static_cast<uint32_t>(
      static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(a)) * static_cast<int32_t>(b)) >> 32);
  const uint64_t high = high_product(wide_a, wide_b);
  r[kUmul64hiLow] = static_cast<uint32_t>(high);
  r[kUmul64hiHigh] = static_cast<uint32_t>(high >> 32);
  r[kFloat2IntRn] = static_cast<uint32_t>(round_half_even(f));
  r[kFloat2IntRz] = static_cast<uint32_t>(static_cast<int>(std::trunc(f)));
  r[kFloat2IntRd] = static_cast<uint32_t>(static_cast<int>(std::floor(f)));
  r[kFloat2IntRu] = static_cast<uint32_t>(static_cast<int>(std::ceil(f)));
  const float g = f / 1048576.0f;
  r[kSaturate] = float_bits(g <= 0.0f ? 0.0f : (g >= 1.0f ? 1.0f : g));
  r[kMinInt] = static_cast<uint32_t>(std::min(static_cast<int32_t>(a), static_cast<int32_t>(b)));
  r[kMaxUnsigned] = std::max(a, b);
  r[kFloatBitsRoundTrip] = a;
  r[kPopcll] = popcount(wide_a);
  r[kClzll] = leading_zeros(wide_a, 64);
  r[kFfsll] = first_set(wide_a, 64);
  return r;
}

}  // namespace

TEST_CASE("integer and conversion intrinsics give CUDA's exact results", "[gpu]") {
  if (!have_gpu()) return;
  std::vector<uint32_t> a = {0, 1, 0xffffffffu, 0x80000000u, 0x7fffffffu, 0x00000280u, 0xfffffd80u, 0x7f800001u},
                        b = {0, 0xffffffffu, 1, 0x80000000u, 31, 0x3210u, 0x7654u, 0xffc00000u};
  std::mt19937 rng(11);
  for (int i = 0; i < 2048; ++i) {
    a.push_back(static_cast<uint32_t>(rng()));
    b.push_back(i % 4 == 0 ? static_cast<uint32_t>(rng()) >> (i % 31) : static_cast<uint32_t>(rng()));
  }
  const std::vector<uint32_t> got = run(a, b);
  static const char* const names[kNumResults] = {
      "__popc", "__clz", "__ffs", "__brev", "__byte_perm", "__funnelshift_l", "__funnelshift_r", "__umulhi",
      "__mulhi", "__umul64hi (low)", "__umul64hi (high)", "__float2int_rn", "__float2int_rz", "__float2int_rd",
      "__float2int_ru", "__saturatef", "min(int)", "max(unsigned)", "__float_as_uint(__uint_as_float)", "__popcll",
      "__clzll", "__ffsll"};
  int wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<uint32_t> want = expected(a[i], b[i]);
    for (int r = 0; r < kNumResults; ++r) {
      if (got[i * kNumResults + r] == want[r]) continue;
      if (++wrong <= 10)
        UNSCOPED_INFO(names[r] << " of a=" << a[i] << " b=" << b[i] << ": got " << got[i * kNumResults + r]
                               << ", expected " << want[r]);
    }
  }
  CHECK(wrong == 0);
}
