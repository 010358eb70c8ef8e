// [gpu] The CUDA backend's own plumbing, not its kernels: pinned host buffers (allocate_host) that
// copies move directly, a step's copies staged through the pinned arena whatever their total,
// and a graph capture that fails without leaving its error behind for the next launch to be
// blamed for. On a GPU (test_gpu) and on the emulator (test_backend_gpu_emu), whose streams are
// asynchronous: a copy's bytes are there only after synchronize().
#include <algorithm>
#include <cstring>
#include <numeric>

#include "cuda_test_util.hpp"
#include "kernels/cuda/cuda_check.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

// y = rms_norm(x) over one row of `n` bf16: any small kernel whose launch checks cudaGetLastError.
void launch_norm(Backend& gpu, const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& y, int64_t n) {
  RmsNormParams p;
  p.x = x.data();
  p.weight = w.as<std::uint16_t>();
  p.out = y.data();
  p.num_tokens = 1;
  p.num_heads = 1;
  p.dim = n;
  p.eps = 1e-6f;
  gpu.rms_norm(p, Stream{});
}

}  // namespace

TEST_CASE("pinned host buffers round-trip, and land only at synchronize", "[gpu]") {
  std::unique_ptr<Backend> gpu = cuda_backend_or_skip();
  if (!gpu) return;
  constexpr std::size_t kN = 1 << 16;
  HostArray<float> up(*gpu), down(*gpu);
  up.resize(kN);
  down.resize(kN);
  CHECK(std::all_of(down.data(), down.data() + kN, [](float x) { return x == 0.0f; }));  // zeroed
  std::iota(up.data(), up.data() + kN, 1.0f);
  DeviceBuffer d(*gpu, kN * sizeof(float));
  gpu->copy_to_device(d.data(), up.data(), kN * sizeof(float), Stream{});
  gpu->copy_to_host(down.data(), d.data(), kN * sizeof(float), Stream{});
  gpu->synchronize(Stream{});
  CHECK(std::memcmp(up.data(), down.data(), kN * sizeof(float)) == 0);
  down.resize(kN / 2);  // within the capacity: the same buffer
  CHECK(down.data()[5] == 6.0f);
  down.resize(2 * kN);  // beyond it: a new, zeroed one
  CHECK(down.data()[5] == 0.0f);
}

TEST_CASE("a step's staged copies may exceed the arena: all land, in order", "[gpu]") {
  std::unique_ptr<Backend> gpu = cuda_backend_or_skip();
  if (!gpu) return;
  // Pageable copies go through the pinned arena (1 MiB at first): 40 uploads and downloads of
  // 256 KiB in one step make it drain and grow mid-step; every byte must still arrive.
  constexpr std::size_t kCopies = 40, kN = 64 * 1024;
  std::vector<std::vector<float>> sources(kCopies, std::vector<float>(kN)), results(kCopies, std::vector<float>(kN));
  std::vector<DeviceBuffer> buffers;
  for (std::size_t c = 0; c < kCopies; ++c) {
    std::iota(sources[c].begin(), sources[c].end(), static_cast<float>(c * kN));
    buffers.emplace_back(*gpu, kN * sizeof(float));
    gpu->copy_to_device(buffers[c].data(), sources[c].data(), kN * sizeof(float), Stream{});
  }
  for (std::size_t c = 0; c < kCopies; ++c)
    gpu->copy_to_host(results[c].data(), buffers[c].data(), kN * sizeof(float), Stream{});
  gpu->synchronize(Stream{});
  for (std::size_t c = 0; c < kCopies; ++c) CHECK(results[c] == sources[c]);
}

TEST_CASE("a failed graph capture leaves no error for the next launch to be blamed for", "[gpu]") {
  std::unique_ptr<Backend> gpu = cuda_backend_or_skip();
  if (!gpu) return;
  constexpr int64_t kN = 256;
  const DeviceBuffer x = to_device(*gpu, random_bf16(kN, 1)), w = to_device(*gpu, random_bf16(kN, 2));
  DeviceBuffer y(*gpu, kN * 2);
  gpu->begin_capture(Stream{});
  launch_norm(*gpu, x, w, y, kN);
  // Someone else's call that may synchronise invalidates the capture (global capture mode).
  void* other = nullptr;
  CHECK(cudaMalloc(&other, 16) == cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();  // that caller's error, cleared by that caller
  CHECK_THROWS_WITH(gpu->end_capture(Stream{}), Catch::Contains("cudaStreamEndCapture"));
  CHECK(cudaPeekAtLastError() == cudaSuccess);
  CHECK_NOTHROW(launch_norm(*gpu, x, w, y, kN));  // its CUDA_CHECK(cudaGetLastError()) sees no stale error
  CHECK_NOTHROW(gpu->synchronize(Stream{}));
}
