// The emulator's diagnostics: each misuse aborts the process with a message that names the
// kernel, the block and the thread (each case runs in a forked child).
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/launch.hpp"
#include "tests/unit/asan.hpp"
#include "tests/unit/cuda_emu/child_process.hpp"
#include "tests/unit/cuda_emu/device_memory.hpp"

using fp8serve::test::ChildResult;
using fp8serve::test::run_in_child;

namespace {

constexpr unsigned kFull = 0xffffffffu;

constexpr int kShuffleLine = __LINE__ + 4;
__global__ void exited_lane_kernel(int* out) {
  const unsigned lane = threadIdx.x % 32;
  if (blockIdx.x == 2 && lane >= 16) return;  // only block 2 leaves lanes behind
  out[blockIdx.x * blockDim.x + threadIdx.x] = __shfl_down_sync(kFull, static_cast<int>(lane), 1);
}

__global__ void partial_warp_kernel(int* out) { out[threadIdx.x] = __shfl_sync(kFull, 1, 0); }

__global__ void own_bit_kernel(int* out) { out[threadIdx.x] = __shfl_sync(0x1u, 1, 0); }

__global__ void outside_mask_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 16);
}

__global__ void bad_width_kernel(int* out) { out[threadIdx.x] = __shfl_sync(kFull, 1, 0, 12); }

__global__ void mixed_ops_kernel(int* out) {
  if (threadIdx.x % 2 == 0)
    out[threadIdx.x] = __shfl_sync(kFull, 1, 0);
  else
    out[threadIdx.x] = static_cast<int>(__ballot_sync(kFull, 1));
}

__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x >= 16 && threadIdx.x < 32) out[threadIdx.x] = __shfl_sync(kFull, 1, 0);
  __syncthreads();
}

__global__ void split_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    out[threadIdx.x] = 1;
    __syncthreads();
  } else {
    __syncthreads();
  }
}

__global__ void trap_kernel(int* out) {
  if (threadIdx.x == 7) __trap();
  out[threadIdx.x] = 1;
}

__global__ void big_static_shared_kernel(int* out) {
  FP8SERVE_SHARED(char[40000], first);
  FP8SERVE_SHARED(char[10000], second);
  out[threadIdx.x] = first[threadIdx.x] + second[threadIdx.x];
}

__global__ void nested_launch_kernel(int* out);
__global__ void nested_launch_kernel(int* out) {
  if (threadIdx.x == 0) FP8SERVE_LAUNCH(nested_launch_kernel, 1, 1, 0, nullptr, out);
}

int* device_ints(size_t n) { return fp8serve::test::device_alloc<int>(n); }

// Launches run when the host waits for them: the child waits, so the kernel runs there.
ChildResult run_kernel_in_child(const std::function<void()>& launch) {
  return run_in_child([&] {
    launch();
    cudaDeviceSynchronize();
  });
}

void check_message(const ChildResult& r, const std::vector<std::string>& parts) {
  INFO("child's stderr:\n" << r.stderr_text);
  CHECK(r.aborted);
  for (const std::string& part : parts) CHECK(r.stderr_text.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("a warp op whose mask names an exited lane aborts, naming kernel, block and thread") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(exited_lane_kernel, 4, 64, 0, nullptr, device_ints(256)); });
  check_message(r, {"kernel exited_lane_kernel", "block (2,0,0)", "thread (0,0,0) (warp 0, lane 0)", "__shfl_down_sync",
                    "test_diagnostics.cpp:" + std::to_string(kShuffleLine), "mask 0xffffffff names lane 16, which has exited"});
}

TEST_CASE("a mask naming a lane of a partial warp that does not exist aborts") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(partial_warp_kernel, 1, 48, 0, nullptr, device_ints(48)); });
  check_message(r, {"partial_warp_kernel", "thread (32,0,0) (warp 1, lane 0)",
                    "names lane 16, which this block does not have (48 threads)"});
}

TEST_CASE("a lane calling a warp op with its own bit clear aborts") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(own_bit_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"mask 0x00000001 does not name the calling lane"});  // whichever lane runs first
}

TEST_CASE("a shuffle reading a lane outside its mask aborts") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(outside_mask_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"__shfl_xor_sync", "lane 0 reads lane 16, which is not in the mask 0x0000ffff"});
}

TEST_CASE("a shuffle width that is not a power of 2 aborts") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(bad_width_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"width 12 is not a power of 2 in [1, 32]"});
}

TEST_CASE("lanes of one mask at different warp ops abort") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(mixed_ops_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"thread (0,0,0)", "__shfl_sync", "names lane 1, which waits at __ballot_sync"});
}

TEST_CASE("a deadlock aborts and prints every thread's state") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(deadlock_kernel, 1, 64, 0, nullptr, device_ints(64)); });
  check_message(r, {"deadlock in kernel deadlock_kernel, block (0,0,0)", "threads 0-15 (warps 0-0): __syncthreads",
                    "threads 16-31 (warps 0-0): __shfl_sync mask 0xffffffff", "threads 32-63 (warps 1-1): __syncthreads"});
}

TEST_CASE("threads of a block at different __syncthreads abort") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(split_barrier_kernel, 1, 64, 0, nullptr, device_ints(64)); });
  check_message(r, {"thread (32,0,0)", "a block must meet at one barrier"});
}

TEST_CASE("__trap aborts, naming the thread") {
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(trap_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"thread (7,0,0)", "__trap", "the kernel trapped"});
}

TEST_CASE("more than 48 KiB of static shared memory aborts") {
  const ChildResult r =
      run_kernel_in_child([] { FP8SERVE_LAUNCH(big_static_shared_kernel, 1, 32, 0, nullptr, device_ints(32)); });
  check_message(r, {"FP8SERVE_SHARED", "static shared memory reaches 50000 bytes, over the 48 KiB nvcc allows"});
}

TEST_CASE("a host pointer passed to a kernel aborts the launch") {
  const ChildResult r = run_in_child([] {
    std::vector<int> host(32);
    FP8SERVE_LAUNCH(trap_kernel, 1, 32, 0, nullptr, host.data());
  });
  check_message(r, {"kernel trap_kernel: argument 0", "points to neither cudaMalloc nor cudaMallocHost memory"});
}

TEST_CASE("launching from inside a kernel, and warp ops outside one, abort") {
  check_message(run_kernel_in_child([] { FP8SERVE_LAUNCH(nested_launch_kernel, 1, 1, 0, nullptr, device_ints(1)); }),
                {"kernel nested_launch_kernel launched from inside a kernel"});
  check_message(run_in_child([] { __syncthreads(); }), {"__syncthreads called outside a kernel"});
}

TEST_CASE("occupancy of a kernel that ptxas's table does not know aborts, naming it") {
  const ChildResult r = run_in_child([] {
    int ctas = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, trap_kernel, 32, 0);
  });
  check_message(r, {"occupancy: kernel '(anonymous namespace)::trap_kernel'", "has no entry in",
                    "kernel_resources.py update"});
}

TEST_CASE("the child helper tells an abort from a clean exit") {
  const ChildResult clean = run_kernel_in_child([] { FP8SERVE_LAUNCH(trap_kernel, 1, 1, 0, nullptr, device_ints(1)); });
  CHECK_FALSE(clean.aborted);
  CHECK(clean.exit_code == 0);
}


#if FP8SERVE_TEST_ASAN
namespace {
__global__ void out_of_bounds_kernel(int* out, int n) { out[n + static_cast<int>(threadIdx.x)] = 1; }
}  // namespace
#endif

TEST_CASE("ASan reports a kernel's access one past a cudaMalloc allocation") {
#if FP8SERVE_TEST_ASAN
  const ChildResult r = run_kernel_in_child([] { FP8SERVE_LAUNCH(out_of_bounds_kernel, 1, 1, 0, nullptr, device_ints(10), 10); });
  INFO(r.stderr_text);
  CHECK((r.aborted || r.exit_code != 0));
  CHECK(r.stderr_text.find("heap-buffer-overflow") != std::string::npos);
  CHECK(r.stderr_text.find("out_of_bounds_kernel") != std::string::npos);
#else
  WARN("not an ASan build: the out-of-bounds case runs in the sanitizer pass");
#endif
}
