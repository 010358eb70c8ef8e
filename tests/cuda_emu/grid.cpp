// The emulator's launch: checks the configuration as a GPU would, then shares the grid's blocks
// among worker threads, each running one block at a time to its end.
#include "tests/cuda_emu/runtime.hpp"
#include "tests/cuda_emu/warp_scheduler.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace fp8serve::emu {
namespace {
std::atomic<unsigned> g_worker_threads{0};
std::atomic<uint64_t> g_launches{0};

uint64_t seed_from_environment() {
  if (const char* text = std::getenv("FP8SERVE_EMU_SEED"); text != nullptr && *text != '\0') {
    char* end = nullptr;
    const unsigned long long seed = std::strtoull(text, &end, 10);
    if (*end != '\0') detail::die("FP8SERVE_EMU_SEED=%s is not a decimal number", text);
    return seed;
  }
  return (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
}

std::atomic<uint64_t>& seed_setting() {
  static std::atomic<uint64_t> seed{seed_from_environment()};
  return seed;
}

// Once per process, at the first launch: the seed that reproduces this run's thread order.
void announce_seed() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::fprintf(stderr, "fp8serve CUDA emulator: thread order seed %llu (FP8SERVE_EMU_SEED=%llu repeats it)\n",
                 static_cast<unsigned long long>(thread_order_seed()),
                 static_cast<unsigned long long>(thread_order_seed()));
  });
}
}  // namespace

void set_thread_order_seed(uint64_t seed) { seed_setting().store(seed); }
uint64_t thread_order_seed() { return seed_setting().load(std::memory_order_relaxed); }

void set_worker_threads(unsigned count) { g_worker_threads.store(count); }

unsigned worker_threads() {
  const unsigned count = g_worker_threads.load();
  // At least two, so that atomics between blocks are exercised even on one core.
  return count != 0 ? count : std::clamp(std::thread::hardware_concurrency(), 2u, 4u);
}

uint64_t fiber_switches() { return detail::fiber_switch_count(); }

namespace detail {

void check_pointer_argument(const char* kernel, unsigned index, const void* pointer) {
  if (!is_device_accessible(pointer))
    die("kernel %s: argument %u (%p) points to neither cudaMalloc nor cudaMallocHost memory (a GPU would fault)",
        kernel, index, pointer);
}

void run_grid(const KernelCall& call, dim3 grid, dim3 block, size_t shared_bytes) {
  if (in_kernel()) die("kernel %s launched from inside a kernel: device-side launches are not emulated", call.name);
  announce_seed();
  const Launch launch{call, grid, block, shared_bytes, g_launches.fetch_add(1)};
  const uint64_t num_blocks = uint64_t{grid.x} * grid.y * grid.z;
  const auto num_workers = static_cast<unsigned>(std::min<uint64_t>(worker_threads(), num_blocks));
  std::atomic<uint64_t> next_block{0};
  std::vector<std::thread> workers;
  workers.reserve(num_workers);
  for (unsigned w = 0; w < num_workers; ++w) {
    workers.emplace_back([&] {
      BlockRunner runner(launch);
      for (uint64_t b = next_block.fetch_add(1); b < num_blocks; b = next_block.fetch_add(1)) runner.run(b);
    });
  }
  for (std::thread& worker : workers) worker.join();
}

void launch(const KernelCall& call, std::shared_ptr<const void> args, dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream) {
  if (in_kernel()) die("kernel %s launched from inside a kernel: device-side launches are not emulated", call.name);
  if (record_error(check_launch(call.function, grid, block, shared_bytes, stream)) != cudaSuccess) return;
  auto run = [call, args = std::move(args), grid, block, shared_bytes] { run_grid(call, grid, block, shared_bytes); };
  if (is_capturing(stream)) {
    record_node(stream, std::move(run));
  } else {
    record_error(enqueue(stream, std::move(run)));
  }
}

}  // namespace detail
}  // namespace fp8serve::emu
