#pragma once
// Shared helpers of the ops tests: seeded random tensors, bf16 weights, ulp distance.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu::test {

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint32_t seed,
                                              float scale = 1.0f) {
  std::vector<std::uint16_t> out(n);
  const std::vector<float> values = random_floats(n, seed, scale);
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bf16(values[i]);
  return out;
}

inline std::uint32_t bits_of(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

inline float float_of(std::uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Distance in units in the last place between two finite floats (0 for +0 vs -0).
inline int64_t ulp_distance(float a, float b) {
  auto key = [](float v) {
    const std::int64_t bits = bits_of(v);
    return (bits & 0x80000000) ? -(bits & 0x7fffffff) : bits;
  };
  const int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

constexpr double kUnitRoundoff = 0x1p-24;  // fp32 u = 2^-24

}  // namespace fp8serve::cpu::test
