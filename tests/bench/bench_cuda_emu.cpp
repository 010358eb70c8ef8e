// bench_cuda_emu: what the CUDA emulator costs, next to its limit, a bare ucontext switch.
//
//   bench_cuda_emu [--rounds N]
//
// Prints, all measured in this run:
//   - bare ucontext: a swapcontext round trip between two contexts on one thread (what every
//     fiber resume costs at least: two switches, each a sigprocmask system call);
//   - resumes per second of three kernels: __syncthreads in a loop, __shfl_xor_sync in a loop,
//     and an empty kernel (each thread's start: getcontext + makecontext), with 1 worker and with
//     the default count;
//   - the time of an empty launch of one thread (worker threads started and joined).
#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cuda/launch.hpp"

namespace {

__global__ void barrier_kernel(int rounds, int* out) {
  int v = 0;
  for (int i = 0; i < rounds; ++i) {
    __syncthreads();
    v += i;
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void shuffle_kernel(int rounds, int* out) {
  int v = static_cast<int>(threadIdx.x);
  for (int i = 0; i < rounds; ++i) v += __shfl_xor_sync(0xffffffffu, v, 1 + i % 16) & 1;
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void empty_kernel(int, int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ucontext_t g_main, g_other;
int g_round_trips = 0;

void other_body() {
  for (;;) swapcontext(&g_other, &g_main);
}

// Round trips per second between two bare contexts: the floor under a fiber resume.
double bare_round_trips_per_second(int count) {
  std::vector<char> stack(64 * 1024);
  getcontext(&g_other);
  g_other.uc_stack.ss_sp = stack.data();
  g_other.uc_stack.ss_size = stack.size();
  g_other.uc_link = nullptr;
  makecontext(&g_other, other_body, 0);
  const auto start = std::chrono::steady_clock::now();
  for (g_round_trips = 0; g_round_trips < count; ++g_round_trips) swapcontext(&g_main, &g_other);
  return count / seconds_since(start);
}

void measure(const char* name, void (*kernel)(int, int*), unsigned blocks, unsigned threads, int rounds, int* out) {
  for (const unsigned workers : {1u, 0u}) {
    fp8serve::emu::set_worker_threads(workers);
    const uint64_t before = fp8serve::emu::fiber_switches();
    const auto start = std::chrono::steady_clock::now();
    FP8SERVE_LAUNCH(kernel, blocks, threads, 0, nullptr, rounds, out);
    CUDA_CHECK(cudaGetLastError());
    const double s = seconds_since(start);
    const double resumes = static_cast<double>(fp8serve::emu::fiber_switches() - before);
    std::printf("  %-34s %u worker(s): %9.0f resumes in %6.3f s = %5.2f M/s\n", name, fp8serve::emu::worker_threads(),
                resumes, s, resumes / s / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 200;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
  const double bare = bare_round_trips_per_second(200'000);
  std::printf("bare ucontext round trip (the limit): %.2f M/s\n", bare / 1e6);
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, 64 * 1024 * sizeof(int)));
  int* d = static_cast<int*>(out);
  std::printf("fiber resumes (a resume is a round trip worker -> fiber -> worker):\n");
  measure("__syncthreads loop, 8 x 256", barrier_kernel, 8, 256, rounds, d);
  measure("__shfl_xor_sync loop, 8 x 256", shuffle_kernel, 8, 256, rounds, d);
  measure("empty kernel, 256 x 256 (starts)", empty_kernel, 256, 256, 0, d);
  const int launches = 200;
  fp8serve::emu::set_worker_threads(0);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < launches; ++i) FP8SERVE_LAUNCH(empty_kernel, 1, 1, 0, nullptr, 0, d);
  std::printf("empty launch of one thread: %.1f us\n", seconds_since(start) / launches * 1e6);
  CUDA_CHECK(cudaFree(out));
  return 0;
}
