// The emulator's runtime-API subset: what it returns, the errors a GPU would give, and the last
// error that every failing call leaves for cudaGetLastError.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cuda/launch.hpp"
#include "tests/unit/cuda_emu/device_memory.hpp"

using fp8serve::test::device_alloc;

namespace {

__global__ void fill_kernel(int* out, int value) { out[blockIdx.x * blockDim.x + threadIdx.x] = value; }

__global__ void shared_bytes_kernel(unsigned char* out) {
  FP8SERVE_DYNAMIC_SHARED(unsigned char, bytes);
  if (threadIdx.x == 0) *out = bytes[0];
}

}  // namespace

TEST_CASE("cudaMalloc, cudaMemcpy, cudaMemset and cudaFree") {
  int* d = device_alloc<int>(64);
  CHECK(reinterpret_cast<uintptr_t>(d) % 256 == 0);
  std::vector<int> host(64);
  REQUIRE(cudaMemcpy(host.data(), d, 64 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int v : host) CHECK(v == -1);  // fresh device memory reads as 0xff bytes
  REQUIRE(cudaMemset(d, 0, 64 * sizeof(int)) == cudaSuccess);
  std::vector<int> values(64);
  for (int i = 0; i < 64; ++i) values[i] = i * i;
  REQUIRE(cudaMemcpy(d + 8, values.data(), 8 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  int* e = device_alloc<int>(64);
  REQUIRE(cudaMemcpyAsync(e, d, 64 * sizeof(int), cudaMemcpyDeviceToDevice, nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpy(host.data(), e, 64 * sizeof(int), cudaMemcpyDefault) == cudaSuccess);
  for (int i = 0; i < 64; ++i) CHECK(host[i] == (i >= 8 && i < 16 ? (i - 8) * (i - 8) : 0));
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(e) == cudaSuccess);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("copies are checked against the allocations and the direction") {
  int* d = device_alloc<int>(16);
  std::vector<int> host(32);
  (void)cudaGetLastError();
  // Past the allocation's end, host and device swapped, a device range passed as host.
  CHECK(cudaMemcpy(d, host.data(), 17 * sizeof(int), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);  // reading it cleared it
  CHECK(cudaMemcpy(host.data(), d, 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 4, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), host.data() + 16, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 4, static_cast<cudaMemcpyKind>(7)) == cudaErrorInvalidMemcpyDirection);
  CHECK(cudaMemset(host.data(), 0, 4) == cudaErrorInvalidValue);
  CHECK(cudaMemset(d + 15, 0, 8) == cudaErrorInvalidValue);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue);  // peeking keeps it
  (void)cudaGetLastError();
  // Freeing twice, or something cudaMalloc did not return.
  CHECK(cudaFree(d + 1) == cudaErrorInvalidValue);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);
  CHECK(cudaFreeHost(host.data()) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_CASE("the last error belongs to the host thread that made it") {
  (void)cudaGetLastError();
  std::thread([] { CHECK(cudaSetDevice(3) == cudaErrorInvalidDevice); }).join();
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("cudaMemGetInfo counts cudaMalloc against a fake total, and cudaMalloc fails beyond it") {
  fp8serve::emu::set_device_memory_bytes(size_t{1} << 20);
  size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  CHECK(total == size_t{1} << 20);
  CHECK(free == total);
  void* a = nullptr;
  REQUIRE(cudaMalloc(&a, 300'000) == cudaSuccess);
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  CHECK(free == total - 300'000);
  void* b = nullptr;
  CHECK(cudaMalloc(&b, 800'000) == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  void* host = nullptr;
  REQUIRE(cudaMallocHost(&host, 800'000) == cudaSuccess);  // pinned host memory is not device memory
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  CHECK(free == total - 300'000);
  CHECK(cudaFreeHost(host) == cudaSuccess);
  CHECK(cudaFree(a) == cudaSuccess);
  fp8serve::emu::set_device_memory_bytes(size_t{8} << 30);
}

TEST_CASE("streams and events are handles a GPU would accept") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  int* d = device_alloc<int>(64);
  FP8SERVE_LAUNCH(fill_kernel, 2, 32, 0, stream, d, 7);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  std::vector<int> host(64);
  REQUIRE(cudaMemcpyAsync(host.data(), d, 64 * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  for (int v : host) CHECK(v == 7);

  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr;
  REQUIRE(cudaEventCreate(&start) == cudaSuccess);
  REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
  float ms = -1.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaErrorInvalidResourceHandle);  // not recorded yet
  REQUIRE(cudaEventRecord(start, stream) == cudaSuccess);
  FP8SERVE_LAUNCH(fill_kernel, 2, 32, 0, stream, d, 8);
  REQUIRE(cudaEventRecord(stop, stream) == cudaSuccess);
  REQUIRE(cudaEventRecord(untimed, stream) == cudaSuccess);
  CHECK(cudaEventSynchronize(stop) == cudaSuccess);
  CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess);
  CHECK(ms >= 0.0f);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamWaitEvent(stream, stop, 0) == cudaSuccess);

  CHECK(cudaEventDestroy(start) == cudaSuccess);
  CHECK(cudaEventDestroy(start) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventDestroy(stop) == cudaSuccess);
  CHECK(cudaEventDestroy(untimed) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  // A destroyed stream is an invalid handle, for a launch too.
  (void)cudaGetLastError();
  FP8SERVE_LAUNCH(fill_kernel, 2, 32, 0, stream, d, 9);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamSynchronize(stream) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  (void)cudaGetLastError();
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("launch configurations a GPU rejects are launch errors, and nothing runs") {
  int* d = device_alloc<int>(2048);
  REQUIRE(cudaMemset(d, 0, 2048 * sizeof(int)) == cudaSuccess);
  const auto rejected = [&](dim3 grid, dim3 block, size_t shared) {
    FP8SERVE_LAUNCH(fill_kernel, grid, block, shared, nullptr, d, 1);
    return cudaGetLastError();
  };
  CHECK(rejected(1, 1025, 0) == cudaErrorInvalidConfiguration);
  CHECK(rejected(1, dim3(32, 1, 65), 0) == cudaErrorInvalidConfiguration);
  CHECK(rejected(0, 32, 0) == cudaErrorInvalidConfiguration);
  CHECK(rejected(dim3(1, 65536), 32, 0) == cudaErrorInvalidConfiguration);
  CHECK(rejected(1, 32, 48 * 1024 + 1) == cudaErrorInvalidValue);
  std::vector<int> host(2048);
  REQUIRE(cudaMemcpy(host.data(), d, host.size() * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int v : host) CHECK(v == 0);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("cudaFuncSetAttribute raises a kernel's dynamic shared memory up to the opt-in limit") {
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  unsigned char* d = device_alloc<unsigned char>(1);
  (void)cudaGetLastError();
  FP8SERVE_LAUNCH(shared_bytes_kernel, 1, 32, 100 * 1024, nullptr, d);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaFuncSetAttribute(shared_bytes_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(prop.sharedMemPerBlockOptin) + 1) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  REQUIRE(cudaFuncSetAttribute(shared_bytes_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) ==
          cudaSuccess);
  FP8SERVE_LAUNCH(shared_bytes_kernel, 1, 32, 100 * 1024, nullptr, d);
  CHECK(cudaGetLastError() == cudaSuccess);
  unsigned char first = 0;
  REQUIRE(cudaMemcpy(&first, d, 1, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(first == 0xff);  // dynamic shared memory reads as 0xff until written
  CHECK(cudaFuncSetAttribute(shared_bytes_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) ==
        cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
}

TEST_CASE("one H100-like device") {
  int count = 0, device = -1, driver = 0;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);
  CHECK(cudaSetDevice(0) == cudaSuccess);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  (void)cudaGetLastError();
  CHECK(cudaDriverGetVersion(&driver) == cudaSuccess);
  CHECK(driver == CUDART_VERSION);
  cudaDeviceProp prop{};
  REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
  CHECK(std::strcmp(prop.name, "fp8serve CUDA emulator") == 0);
  CHECK(prop.major == 9);
  CHECK(prop.minor == 0);
  CHECK(prop.warpSize == 32);
  CHECK(prop.maxThreadsPerBlock == 1024);
  CHECK(prop.multiProcessorCount == 132);
  CHECK(prop.sharedMemPerBlock == 48 * 1024);
  CHECK(prop.sharedMemPerBlockOptin == 227 * 1024);
  CHECK(prop.totalGlobalMem == size_t{8} << 30);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(sms == prop.multiProcessorCount);
}

TEST_CASE("stream capture and graphs report cudaErrorNotSupported") {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  CHECK(cudaStreamIsCapturing(nullptr, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorNotSupported);
  CHECK(cudaGetLastError() == cudaErrorNotSupported);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaStreamEndCapture(nullptr, &graph) == cudaErrorNotSupported);
  CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaErrorNotSupported);
  CHECK(cudaGraphLaunch(exec, nullptr) == cudaErrorNotSupported);
  (void)cudaGetLastError();
}

TEST_CASE("error names and strings") {
  CHECK(std::strcmp(cudaGetErrorName(cudaSuccess), "cudaSuccess") == 0);
  CHECK(std::strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
  CHECK(std::strcmp(cudaGetErrorName(cudaErrorNotSupported), "cudaErrorNotSupported") == 0);
  CHECK(std::strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
  // CUDA_CHECK turns a failure into an exception naming the call and CUDA's words.
  try {
    CUDA_CHECK(cudaSetDevice(5));
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("cudaSetDevice(5) failed: cudaErrorInvalidDevice") != std::string::npos);
  }
  (void)cudaGetLastError();
}
