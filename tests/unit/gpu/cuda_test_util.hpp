#pragma once
// Shared by the CUDA backend's op tests (tests/unit/gpu/test_*_gpu.cpp). Each file is compiled twice:
// into test_gpu against a real device (tag [gpu]; skips with a warning where there is none) and
// into its own test_<file>_emu against the CPU emulator, where it always runs. The op under test
// runs on the CUDA backend; its host reference is the CPU backend's op (kernels/cpu/), run on the
// same bf16 values widened to fp32.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/make_cuda_backend.hpp"

namespace fp8serve::gpu_test {

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

// The CUDA backend, or null (and a warning) where no device exists: the test then returns.
inline std::unique_ptr<Backend> cuda_backend_or_skip() {
  if (cuda::device_count() == 0) {
    WARN("no CUDA device: [gpu] test skipped");
    return nullptr;
  }
  return cuda::make_cuda_backend(0);
}

template <typename T>
DeviceBuffer to_device(Backend& backend, const std::vector<T>& host) {
  DeviceBuffer buffer(backend, host.size() * sizeof(T));
  backend.copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T), Stream{});
  return buffer;
}

template <typename T>
std::vector<T> to_host(Backend& backend, const DeviceBuffer& buffer, std::size_t count) {
  std::vector<T> host(count);
  backend.copy_to_host(host.data(), buffer.data(), count * sizeof(T), Stream{});
  backend.synchronize(Stream{});
  return host;
}

// n bf16 values from N(0, scale^2).
inline std::vector<std::uint16_t> random_bf16(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<std::uint16_t> out(n);
  for (std::uint16_t& v : out) v = bf16_encode(dist(rng));
  return out;
}

inline std::vector<float> widen(const std::vector<std::uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = bf16_decode(bits[i]);
  return out;
}

inline std::vector<std::uint16_t> narrow(const std::vector<float>& values) {
  std::vector<std::uint16_t> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = bf16_encode(values[i]);
  return out;
}

// How many elements of two equally long vectors differ; reports the first few. (CHECK(a == b)
// would print both vectors whole - megabytes for a KV pool.)
template <typename T>
std::size_t count_mismatches(const std::vector<T>& got, const std::vector<T>& expected) {
  REQUIRE(got.size() == expected.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0 && ++differ <= 5) {
      UNSCOPED_INFO("element " << i << " differs: got " << +got[i] << ", expected " << +expected[i]);
    }
  }
  return differ;
}

// Distance in bf16 units in the last place (0 for +0 / -0).
inline int64_t bf16_ulps(std::uint16_t a, std::uint16_t b) {
  auto key = [](std::uint16_t v) -> int64_t { return (v & 0x8000) ? -static_cast<int64_t>(v & 0x7fff) : v; };
  const int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

// How many of `got` (bf16) differ from round(expected) by more than max_ulps, and how many
// differ at all; prints the first few misses.
struct UlpReport {
  std::size_t differ = 0;
  std::size_t beyond = 0;
  int64_t worst = 0;
};
inline UlpReport compare_bf16(const std::vector<std::uint16_t>& got, const std::vector<float>& expected,
                              int64_t max_ulps) {
  REQUIRE(got.size() == expected.size());
  UlpReport r;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int64_t d = bf16_ulps(got[i], bf16_encode(expected[i]));
    r.differ += d != 0;
    r.worst = d > r.worst ? d : r.worst;
    if (d > max_ulps && ++r.beyond <= 5) {
      UNSCOPED_INFO("element " << i << ": got " << bf16_decode(got[i]) << ", expected " << expected[i]);
    }
  }
  return r;
}

}  // namespace fp8serve::gpu_test
