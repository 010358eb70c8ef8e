// [gpu] The CUDA backend's own host paths (cuda_backend.cu, device_runtime.cu) that neither the op
// tests nor test_backend_gpu reach: device selection, its description and memory, allocations the
// device or the host refuse, copies above the staging arena's 64 MiB, what a graph capture
// refuses and what it leaves behind, scratch buffers that grow (and outlive the graphs that
// captured them), copy_blocks' checks and its byte-wise path, the owned cuda::DeviceBuffer and the
// bandwidth probe. Values are small integers where arithmetic is involved, so every expected
// result is exact.
#include <algorithm>
#include <new>
#include <optional>
#include <stdexcept>

#include <cuda_runtime_api.h>

#include "cuda_test_util.hpp"
#include "kernels/cuda/device_runtime.hpp"
#include "tests/unit/asan.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;


namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// r[i] += x[i] on the backend's stream: 1 + 2 = 3 is exact in bf16 (a captured step in small).
struct AddStep {
  DeviceBuffer r, x;
  static constexpr int64_t kElements = 64;
  explicit AddStep(Backend& gpu)
      : r(to_device(gpu, std::vector<std::uint16_t>(kElements, bf16_encode(1.0f)))),
        x(to_device(gpu, std::vector<std::uint16_t>(kElements, bf16_encode(2.0f)))) {}
  void run(Backend& gpu) const {
    ResidualAddParams p;
    p.residual = r.data();
    p.x = x.data();
    p.num_elements = kElements;
    gpu.residual_add(p, Stream{});
  }
  float value(Backend& gpu) const {
    const std::vector<std::uint16_t> host = to_host<std::uint16_t>(gpu, r, kElements);
    for (std::uint16_t v : host)
      if (v != host[0]) return -1.0f;  // every element took the same path
    return bf16_decode(host[0]);
  }
};

// One FP8 K-only pool of tiny blocks (128 bytes: 8 tokens x 1 head x 16) for copy_blocks.
struct BlockPool {
  static constexpr int32_t kBlocks = 2600, kBlockSize = 8, kHeadDim = 16;
  static constexpr std::size_t kBlockBytes = kBlockSize * kHeadDim;
  std::vector<std::uint8_t> host;
  DeviceBuffer device;
  explicit BlockPool(Backend& gpu, std::size_t offset = 0) : host(kBlocks * kBlockBytes + offset) {
    std::mt19937 rng(21);
    for (std::uint8_t& b : host) b = static_cast<std::uint8_t>(rng());
    device = to_device(gpu, host);
  }
  PagedKvView view(std::size_t offset = 0) const {
    return make_paged_kv_view(device.as<std::uint8_t>() + offset, nullptr, KvDtype::fp8_e4m3, kBlocks, kBlockSize, 1,
                              kHeadDim);
  }
  // Copies blocks first..first+count-1 to 1300 + the same, on the device and in `host`.
  void copy(Backend& gpu, int32_t first, int32_t count, std::size_t offset = 0) {
    std::vector<int32_t> src, dst;
    for (int32_t i = 0; i < count; ++i) {
      src.push_back(first + i);
      dst.push_back(1300 + first + i);
      std::copy_n(host.begin() + static_cast<std::ptrdiff_t>(offset + src.back() * kBlockBytes), kBlockBytes,
                  host.begin() + static_cast<std::ptrdiff_t>(offset + dst.back() * kBlockBytes));
    }
    const PagedKvView v = view(offset);
    CopyBlocksParams p;
    p.layers = &v;
    p.num_layers = 1;
    p.src = src.data();
    p.dst = dst.data();
    p.num_copies = count;
    gpu.copy_blocks(p, Stream{});
  }
  std::size_t mismatches(Backend& gpu) const {
    return count_mismatches(to_host<std::uint8_t>(gpu, device, host.size()), host);
  }
};

}  // namespace

TEST_CASE("the CUDA backend refuses a device that does not exist", "[gpu]") {
  if (cuda::device_count() == 0) return;
  CHECK_THROWS_AS(cuda::make_cuda_backend(cuda::device_count()), std::runtime_error);
  CHECK_THROWS_AS(cuda::make_cuda_backend(-1), std::runtime_error);
}

TEST_CASE("the CUDA backend describes its device and reports its memory", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  CHECK(gpu->describe().rfind("cuda", 0) == 0);
  CHECK(gpu->describe().find(cuda::describe_device(0)) != std::string::npos);
  const std::optional<DeviceMemory> before = gpu->memory_info();
  REQUIRE(before.has_value());
  CHECK(before->total > 0);
  CHECK(before->free <= before->total);
  DeviceBuffer held(*gpu, 64 * kMiB);
  const std::optional<DeviceMemory> after = gpu->memory_info();
  REQUIRE(after.has_value());
  CHECK(after->free + 64 * kMiB <= before->free);
}

TEST_CASE("an allocation the device cannot hold throws bad_alloc, and the backend goes on", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  CHECK_THROWS_AS(gpu->allocate(std::size_t{1} << 50), std::bad_alloc);  // a PiB
#if !FP8SERVE_TEST_ASAN  // ASan aborts on a host allocation it cannot make instead of failing it
  CHECK_THROWS_AS(gpu->allocate_host(std::size_t{1} << 50), std::bad_alloc);
#endif
  const std::vector<int32_t> values{1, 2, 3, 4};
  const DeviceBuffer d = to_device(*gpu, values);
  CHECK(to_host<int32_t>(*gpu, d, values.size()) == values);
}

TEST_CASE("copies above the staging arena's 64 MiB go to the driver directly, in stream order", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const std::size_t n = (64 * kMiB + 4096) / sizeof(std::uint32_t);
  std::vector<std::uint32_t> big(n);
  for (std::size_t i = 0; i < n; ++i) big[i] = static_cast<std::uint32_t>(i * 2654435761u);
  DeviceBuffer d(*gpu, n * sizeof(std::uint32_t));
  gpu->copy_to_device(d.data(), big.data(), n * sizeof(std::uint32_t), Stream{});
  // A staged copy after it on the same stream lands after it.
  const std::vector<std::uint32_t> head{7, 8, 9};
  gpu->copy_to_device(d.data(), head.data(), head.size() * sizeof(std::uint32_t), Stream{});
  std::copy(head.begin(), head.end(), big.begin());
  std::vector<std::uint32_t> back(n);
  gpu->copy_to_host(back.data(), d.data(), n * sizeof(std::uint32_t), Stream{});
  gpu->synchronize(Stream{});
  CHECK(count_mismatches(back, big) == 0);
}

TEST_CASE("the staging arena serves one stream at a time: a second stream's copy or synchronize is refused", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  cudaStream_t other = nullptr;
  REQUIRE(cudaStreamCreate(&other) == cudaSuccess);
  DeviceBuffer d(*gpu, 16);
  const std::vector<std::uint32_t> up{1, 2, 3, 4};
  std::vector<std::uint32_t> down(4, 0);
  gpu->copy_to_device(d.data(), up.data(), 16, Stream{});
  gpu->copy_to_host(down.data(), d.data(), 16, Stream{});  // staged: lands at synchronize()
  CHECK_THROWS_WITH(gpu->copy_to_device(d.data(), up.data(), 16, Stream{other}), Catch::Contains("one stream at a time"));
  CHECK_THROWS_WITH(gpu->synchronize(Stream{other}), Catch::Contains("another stream"));
  gpu->synchronize(Stream{});
  CHECK(down == up);
  gpu->copy_to_host(down.data(), d.data(), 16, Stream{other});  // the arena is empty again: any stream
  gpu->synchronize(Stream{other});
  CHECK(down == up);
  REQUIRE(cudaStreamDestroy(other) == cudaSuccess);
}

TEST_CASE("a graph capture refuses what would synchronise, abandons itself, and a new one works", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const AddStep step(*gpu);
  gpu->begin_capture(Stream{});
  CHECK_THROWS_AS(gpu->begin_capture(Stream{}), std::logic_error);  // one capture at a time
  CHECK_THROWS_AS(gpu->allocate(16), std::logic_error);
  CHECK_THROWS_AS(gpu->end_capture(Stream{}), std::logic_error);  // the refusal ended it
  CHECK(step.value(*gpu) == 1.0f);
  gpu->begin_capture(Stream{});
  step.run(*gpu);
  const std::unique_ptr<Backend::Graph> graph = gpu->end_capture(Stream{});
  CHECK(step.value(*gpu) == 1.0f);  // captured, not run
  gpu->replay(*graph, Stream{});
  gpu->replay(*graph, Stream{});
  CHECK(step.value(*gpu) == 5.0f);
}

TEST_CASE("a CUDA backend destroyed during a capture ends it", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  gpu->begin_capture(Stream{});
  gpu.reset();
  // A capture left open in global mode would make the next allocation fail.
  auto next = cuda::make_cuda_backend(0);
  const AddStep step(*next);
  step.run(*next);
  CHECK(step.value(*next) == 3.0f);
}

TEST_CASE("scratch buffers grow with the request and outlive the graphs that captured them", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  BlockPool pool(*gpu);
  // copy_blocks uploads its pairs through a scratch buffer: 1 pair, then 600 (it grows and the
  // old one goes), then - a graph captured meanwhile - 1200 (it grows, the old one is retired).
  pool.copy(*gpu, 0, 1);
  CHECK(pool.mismatches(*gpu) == 0);
  pool.copy(*gpu, 1, 600);
  CHECK(pool.mismatches(*gpu) == 0);
  const AddStep step(*gpu);
  gpu->begin_capture(Stream{});
  step.run(*gpu);
  const std::unique_ptr<Backend::Graph> graph = gpu->end_capture(Stream{});
  pool.copy(*gpu, 0, 1200);
  CHECK(pool.mismatches(*gpu) == 0);
  gpu->replay(*graph, Stream{});
  CHECK(step.value(*gpu) == 3.0f);
}

TEST_CASE("copy_blocks checks its views and copies unaligned pools byte by byte", "[gpu]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  BlockPool pool(*gpu, 4);
  pool.copy(*gpu, 5, 20, 4);  // a pool that starts 4 bytes into its buffer: no 16-byte copies
  CHECK(pool.mismatches(*gpu) == 0);

  PagedKvView view = pool.view();
  const int32_t src = 0, dst = 1;
  CopyBlocksParams p;
  p.layers = &view;
  p.num_layers = 1;
  p.src = &src;
  p.dst = &dst;
  p.num_copies = 1;
  view.block_stride += 16;  // blocks with a gap: not the packed layout the kernel copies
  CHECK_THROWS_AS(gpu->copy_blocks(p, Stream{}), std::invalid_argument);
  view = pool.view();
  p.num_copies = -1;
  CHECK_THROWS_AS(gpu->copy_blocks(p, Stream{}), std::invalid_argument);
  p.num_copies = 0;
  CHECK_NOTHROW(gpu->copy_blocks(p, Stream{}));
  CHECK(pool.mismatches(*gpu) == 0);
}

TEST_CASE("cuda::DeviceBuffer moves its allocation", "[gpu]") {
  if (cuda::device_count() == 0) return;
  const std::vector<std::uint8_t> bytes{1, 2, 3, 4, 5, 6, 7, 8};
  cuda::DeviceBuffer a(bytes.size());
  a.copy_from_host(bytes.data(), bytes.size());
  cuda::DeviceBuffer b(std::move(a));
  CHECK(a.data() == nullptr);  // the moved-from state is the point
  CHECK(a.bytes() == 0);
  cuda::DeviceBuffer c(16);
  c = std::move(b);
  CHECK(b.data() == nullptr);
  REQUIRE(c.bytes() == bytes.size());
  std::vector<std::uint8_t> back(bytes.size());
  c.copy_to_host(back.data(), back.size());
  CHECK(back == bytes);
}

TEST_CASE("measure_copy_bandwidth times device copies", "[gpu]") {
  if (cuda::device_count() == 0) return;
  const double bytes_per_second = cuda::measure_copy_bandwidth(0);
  INFO(bytes_per_second / 1e9 << " GB/s");
  CHECK(bytes_per_second > 0.0);
  CHECK(std::isfinite(bytes_per_second));
}
