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

TEST_CASE("one device, an H200's limits") {
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
  CHECK(std::strcmp(prop.name, "fp8serve CUDA emulator (H200)") == 0);
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

TEST_CASE("stream capture records launches and async copies; a graph launch replays them on current memory") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  int* d = device_alloc<int>(64);
  int* value = device_alloc<int>(1);
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), sizeof(int)) == cudaSuccess);
  *pinned = 5;
  REQUIRE(cudaMemset(d, 0, 64 * sizeof(int)) == cudaSuccess);

  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusActive);
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
  CHECK(cudaGetLastError() == cudaErrorIllegalState);
  // A memcpy node reads its source at each replay; the kernel's value argument is fixed at capture.
  REQUIRE(cudaMemcpyAsync(value, pinned, sizeof(int), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  FP8SERVE_LAUNCH(fill_kernel, dim3(2), dim3(32), 0, stream, d, 7);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaMemsetAsync(d + 32, 0, 32 * sizeof(int), stream) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  REQUIRE(graph != nullptr);
  CHECK(cudaStreamIsCapturing(stream, &status) == cudaSuccess);
  CHECK(status == cudaStreamCaptureStatusNone);

  std::vector<int> host(64);
  auto read = [&] {
    // The graph runs on a non-blocking stream, which cudaMemcpy (the legacy stream) does not wait for.
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    REQUIRE(cudaMemcpy(host.data(), d, 64 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    int v = 0;
    REQUIRE(cudaMemcpy(&v, value, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
  };
  CHECK(read() == -1);  // nothing ran during the capture
  for (int v : host) CHECK(v == 0);

  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  CHECK(read() == 5);
  for (int i = 0; i < 64; ++i) CHECK(host[i] == (i < 32 ? 7 : 0));
  *pinned = 9;  // rewritten in place: the next replay copies the new value
  REQUIRE(cudaMemsetAsync(d, 0, 64 * sizeof(int), stream) == cudaSuccess);  // ordered before the replay
  REQUIRE(cudaGraphLaunch(exec, stream) == cudaSuccess);
  CHECK(read() == 9);
  CHECK(host[0] == 7);
  CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
  CHECK(cudaGraphDestroy(graph) == cudaSuccess);

  // A call that could synchronise during a capture fails and invalidates the capture.
  // A copy from pageable memory cannot be captured: refused, and the capture is lost.
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  std::vector<int> pageable(64, 3);
  CHECK(cudaMemcpyAsync(d, pageable.data(), 64 * sizeof(int), cudaMemcpyHostToDevice, stream) ==
        cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  (void)cudaGetLastError();
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  int* fresh = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&fresh), 16) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamSynchronize(stream) == cudaErrorStreamCaptureUnsupported);
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorStreamCaptureInvalidated);
  CHECK(graph == nullptr);
  CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaErrorIllegalState);  // no capture open
  CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
  (void)cudaGetLastError();

  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(value) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
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

TEST_CASE("work on a stream runs when the host synchronises with it, in CUDA's stream order") {
  cudaStream_t nonblocking = nullptr, blocking = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreate(&blocking) == cudaSuccess);
  int* d = device_alloc<int>(32);
  REQUIRE(cudaMemset(d, 0, 32 * sizeof(int)) == cudaSuccess);
  std::vector<int> host(32);
  auto first = [&] {
    REQUIRE(cudaMemcpy(host.data(), d, 32 * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host[0];
  };
  // A non-blocking stream: the legacy stream's copy does not wait for its kernel.
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, nonblocking, d, 4);
  CHECK(first() == 0);
  CHECK(cudaStreamQuery(nonblocking) == cudaErrorNotReady);  // a query makes progress,
  CHECK(cudaStreamQuery(nonblocking) == cudaSuccess);        // and then the work is done
  CHECK(cudaGetLastError() == cudaSuccess);                  // not-ready is not an error state
  CHECK(first() == 4);
  // A blocking stream: the legacy stream waits for its work, and it for the legacy stream's.
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, blocking, d, 5);
  CHECK(first() == 5);
  // Events order streams: the non-blocking stream's kernel after the blocking stream's.
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, blocking, d, 6);
  REQUIRE(cudaEventRecord(done, blocking) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(nonblocking, done, 0) == cudaSuccess);
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, nonblocking, d, 7);
  REQUIRE(cudaStreamSynchronize(nonblocking) == cudaSuccess);
  CHECK(first() == 7);
  // Without the wait, synchronising the non-blocking stream alone runs its kernel first.
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, blocking, d, 8);
  FP8SERVE_LAUNCH(fill_kernel, 1, 32, 0, nonblocking, d, 9);
  REQUIRE(cudaStreamSynchronize(nonblocking) == cudaSuccess);
  CHECK(first() == 8);  // the legacy copy waited for the blocking stream, which ran last
  CHECK(cudaEventDestroy(done) == cudaSuccess);
  CHECK(cudaStreamDestroy(nonblocking) == cudaSuccess);
  CHECK(cudaStreamDestroy(blocking) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
}

namespace {
__global__ void copy_kernel(const int* in, int* out) { out[threadIdx.x] = in[threadIdx.x]; }
}  // namespace

TEST_CASE("copies follow CUDA's synchronisation rules for pageable and pinned memory") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  int* in = device_alloc<int>(32);
  int* out = device_alloc<int>(32);
  std::vector<int> values(32, 11), host(32);
  // cudaMemcpy from pageable memory returns before its bytes land, on the legacy stream: a kernel
  // on a non-blocking stream that reads them without waiting sees 0xFF (what a GPU does at random).
  REQUIRE(cudaMemcpy(in, values.data(), 32 * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  FP8SERVE_LAUNCH(copy_kernel, 1, 32, 0, stream, static_cast<const int*>(in), out);
  REQUIRE(cudaMemcpyAsync(host.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(host[0] == -1);
  // The same copy on the kernel's stream is ordered before it.
  values.assign(32, 12);
  REQUIRE(cudaMemcpyAsync(in, values.data(), 32 * sizeof(int), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  values.assign(32, 13);  // the driver staged the pageable source at the call
  FP8SERVE_LAUNCH(copy_kernel, 1, 32, 0, stream, static_cast<const int*>(in), out);
  REQUIRE(cudaMemcpyAsync(host.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(host[0] == 12);
  // From pinned memory the copy is asynchronous: the source is read when the stream gets there.
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(int)) == cudaSuccess);
  for (int i = 0; i < 32; ++i) pinned[i] = 14;
  REQUIRE(cudaMemcpyAsync(in, pinned, 32 * sizeof(int), cudaMemcpyHostToDevice, stream) == cudaSuccess);
  for (int i = 0; i < 32; ++i) pinned[i] = 15;  // a race on a GPU; here the copy always reads it
  FP8SERVE_LAUNCH(copy_kernel, 1, 32, 0, stream, static_cast<const int*>(in), out);
  REQUIRE(cudaMemcpyAsync(host.data(), out, 32 * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(host[0] == 15);
  // A download into pinned memory lands when the host synchronises, not before.
  pinned[0] = 0;
  REQUIRE(cudaMemcpyAsync(pinned, out, 32 * sizeof(int), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
  CHECK(pinned[0] == 0);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK(pinned[0] == 15);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
  CHECK(cudaFree(in) == cudaSuccess);
  CHECK(cudaFree(out) == cudaSuccess);
}
