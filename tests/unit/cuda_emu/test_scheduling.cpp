// What the emulator guarantees beyond CUDA's semantics (test_cuda_semantics_gpu checks those):
// shared memory poisoned in every block, blocks isolated while workers run them concurrently,
// threads in a seeded order, thread and block indices in three dimensions, deep fiber stacks, warp
// groups at different ops side by side, one fiber resume per wait. (tests/bench/bench_cuda_emu
// measures what resumes cost.)
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "kernels/cuda/launch.hpp"
#include "tests/unit/cuda_emu/device_memory.hpp"

using fp8serve::test::device_alloc;
using fp8serve::test::download;

namespace {

// Each block reads its static and dynamic shared memory before any thread writes it, then
// writes both; a block that saw the previous block's values would read them back.
__global__ void read_before_write_kernel(unsigned* out) {
  FP8SERVE_SHARED(unsigned[64], tile);
  FP8SERVE_DYNAMIC_SHARED(unsigned, dyn);
  const unsigned t = threadIdx.x;
  out[(blockIdx.x * blockDim.x + t) * 2] = tile[t];
  out[(blockIdx.x * blockDim.x + t) * 2 + 1] = dyn[t];
  __syncthreads();
  tile[t] = blockIdx.x;
  dyn[t] = blockIdx.x;
}

// A race inside the block (every thread increments one shared counter without atomics): one
// fixed answer in the emulator, run after run.
__global__ void racy_kernel(int* out) {
  FP8SERVE_SHARED(int, counter);
  if (threadIdx.x == 0) counter = 0;
  __syncthreads();
  const int seen = counter;
  __syncwarp();  // every lane of the warp reads before any writes
  counter = seen + 1;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = counter;
}

// A missing __syncthreads: each thread reads its left neighbour's element without waiting for it.
__global__ void missing_barrier_kernel(unsigned* out) {
  FP8SERVE_SHARED(unsigned[128], values);
  const unsigned t = threadIdx.x;
  values[t] = t;
  out[blockIdx.x * blockDim.x + t] = values[(t + blockDim.x - 1) % blockDim.x];
}

__global__ void indices_kernel(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned g = block * blockDim.x * blockDim.y * blockDim.z + thread;
  out[g * 4 + 0] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z;
  out[g * 4 + 1] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z;
  out[g * 4 + 2] = blockDim.x + 10 * blockDim.y + 100 * blockDim.z;
  out[g * 4 + 3] = gridDim.x + 10 * gridDim.y + 100 * gridDim.z;
}

__device__ __noinline__ int deep_sum(int depth, const int* values) {
  volatile int local[4096];  // 16 KiB per frame, 64 KiB at depth 4 (HIP-CPU's 7 KiB stacks crashed)
  for (int i = 0; i < 4096; ++i) local[i] = values[i % 8] + depth;
  int s = 0;
  for (int i = 0; i < 4096; i += 512) s += local[i];
  return depth == 0 ? s : s + deep_sum(depth - 1, values);
}

__global__ void deep_stack_kernel(const int* values, int* out) { out[threadIdx.x] = deep_sum(3, values); }

// Lanes 0-15 shuffle while lanes 16-31 vote: two groups at different ops, both valid.
__global__ void side_by_side_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (lane < 16)
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, lane, 1);
  else
    out[threadIdx.x] = static_cast<int>(__ballot_sync(0xffff0000u, lane % 4 == 0));
  __syncwarp(lane < 16 ? 0x0000ffffu : 0xffff0000u);
}

// Lanes 16-31 first shuffle among themselves, then the whole warp shuffles: lanes 0-15 wait at the
// full-warp op while the upper half is still at its own (valid CUDA since Volta).
__global__ void staggered_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int v = lane;
  if (lane >= 16) v = __shfl_down_sync(0xffff0000u, v, 1, 16) * 10;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 16);
}

__global__ void active_mask_kernel(unsigned* out) {
  if (threadIdx.x % 32 >= 20) return;
  out[threadIdx.x] = __activemask();
}

__global__ void ping_pong_kernel(int rounds, int* out) {
  int v = static_cast<int>(threadIdx.x);
  for (int i = 0; i < rounds; ++i) v += __shfl_xor_sync(0xffffffffu, v, 1) & 1;
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

}  // namespace

TEST_CASE("shared memory reads as 0xff in every block until written, whichever worker runs it") {
  for (const unsigned workers : {1u, 3u}) {
    fp8serve::emu::set_worker_threads(workers);
    unsigned* d = device_alloc<unsigned>(8 * 64 * 2);
    FP8SERVE_LAUNCH(read_before_write_kernel, 8, 64, 64 * sizeof(unsigned), nullptr, d);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (unsigned v : download(d, 8 * 64 * 2)) CHECK(v == 0xffffffffu);
    REQUIRE(cudaFree(d) == cudaSuccess);
  }
  fp8serve::emu::set_worker_threads(0);
}

TEST_CASE("a race inside a block gives one fixed answer") {
  int* d = device_alloc<int>(16);
  std::vector<int> first;
  for (int run = 0; run < 3; ++run) {
    FP8SERVE_LAUNCH(racy_kernel, 16, 96, 0, nullptr, d);
    const std::vector<int> got = download(d, 16);
    if (run == 0) first = got;
    CHECK(got == first);
  }
  CHECK(first[0] < 96);  // the race loses increments, the same ones each run (a GPU would lose others)
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("a missing barrier reads unwritten shared memory, whichever neighbour is read") {
  unsigned* d = device_alloc<unsigned>(2 * 128);
  FP8SERVE_LAUNCH(missing_barrier_kernel, 2, 128, 0, nullptr, d);
  const std::vector<unsigned> got = download(d, 2 * 128);
  for (int b = 0; b < 2; ++b) {
    // Threads run in a seeded random order: about half read their neighbour before it writes.
    int unwritten = 0;
    for (int t = 0; t < 128; ++t) {
      const unsigned v = got[static_cast<size_t>(b * 128 + t)];
      unwritten += v == 0xffffffffu;
      if (v != 0xffffffffu) CHECK(v == static_cast<unsigned>((t + 127) % 128));
    }
    CHECK(unwritten > 16);
    CHECK(unwritten < 112);
  }
}

TEST_CASE("thread and block indices in three dimensions") {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const unsigned n = 3 * 2 * 2 * 4 * 3 * 2;
  unsigned* d = device_alloc<unsigned>(n * 4);
  FP8SERVE_LAUNCH(indices_kernel, grid, block, 0, nullptr, d);
  const std::vector<unsigned> got = download(d, n * 4);
  unsigned g = 0;
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 4; ++tx, ++g) {
              CHECK(got[g * 4 + 0] == tx + 10 * ty + 100 * tz);
              CHECK(got[g * 4 + 1] == bx + 10 * by + 100 * bz);
              CHECK(got[g * 4 + 2] == 4 + 10 * 3 + 100 * 2);
              CHECK(got[g * 4 + 3] == 3 + 10 * 2 + 100 * 2);
            }
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("a fiber has room for 64 KiB of locals") {
  const std::vector<int> values = {1, 2, 3, 4, 5, 6, 7, 8};
  int* d_values = device_alloc<int>(8);
  int* d_out = device_alloc<int>(64);
  REQUIRE(cudaMemcpy(d_values, values.data(), sizeof(int) * 8, cudaMemcpyHostToDevice) == cudaSuccess);
  FP8SERVE_LAUNCH(deep_stack_kernel, 1, 64, 0, nullptr, d_values, d_out);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  // Each level samples 8 entries: values[0] + depth each (i multiple of 512, so i % 8 == 0).
  for (int v : download(d_out, 64)) CHECK(v == 8 * (1 + 3) + 8 * (1 + 2) + 8 * (1 + 1) + 8 * (1 + 0));
  REQUIRE(cudaFree(d_values) == cudaSuccess);
  REQUIRE(cudaFree(d_out) == cudaSuccess);
}

TEST_CASE("warp groups at different ops complete side by side; __activemask skips exited lanes") {
  int* d = device_alloc<int>(64);
  FP8SERVE_LAUNCH(side_by_side_kernel, 1, 64, 0, nullptr, d);
  const std::vector<int> got = download(d, 64);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    CHECK(got[t] == (lane < 16 ? (lane ^ 1) : 0x11110000));
  }
  FP8SERVE_LAUNCH(staggered_kernel, 1, 64, 0, nullptr, d);
  const std::vector<int> staggered = download(d, 64);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, partner = lane ^ 16;
    const int upper = partner >= 16 ? partner : lane;  // the upper-half lane of the pair
    const int value = (upper % 16 < 15 ? upper + 1 : upper) * 10;
    CHECK(staggered[t] == (lane < 16 ? value : partner));
  }
  unsigned* mask = device_alloc<unsigned>(64);
  FP8SERVE_LAUNCH(active_mask_kernel, 1, 64, 0, nullptr, mask);
  const std::vector<unsigned> masks = download(mask, 64);
  for (int t = 0; t < 64; ++t)
    if (t % 32 < 20) CHECK(masks[t] == 0x000fffffu);
  REQUIRE(cudaFree(d) == cudaSuccess);
  REQUIRE(cudaFree(mask) == cudaSuccess);
}

TEST_CASE("a thread is resumed once to start and once per completed wait, no more") {
  int* d = device_alloc<int>(8 * 256);
  const uint64_t before = fp8serve::emu::fiber_switches();
  FP8SERVE_LAUNCH(ping_pong_kernel, 8, 256, 0, nullptr, 200, d);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the launch runs when the host waits for it
  CHECK(fp8serve::emu::fiber_switches() - before == 8u * 256u * 201u);
  std::vector<int> v(256);  // the same exchange, lane pairs swapping at once, on the host
  for (int t = 0; t < 256; ++t) v[t] = t;
  for (int round = 0; round < 200; ++round) {
    std::vector<int> next(256);
    for (int t = 0; t < 256; ++t) next[t] = v[t] + (v[t ^ 1] & 1);
    v = next;
  }
  const std::vector<int> got = download(d, 8 * 256);
  for (int t = 0; t < 8 * 256; ++t) CHECK(got[t] == v[t % 256]);
  REQUIRE(cudaFree(d) == cudaSuccess);
}
