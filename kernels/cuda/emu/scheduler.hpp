#pragma once
// The emulator's block scheduler: runs one block at a time of a launch on the calling OS thread,
// each CUDA thread a fiber, and decides when warp ops and barriers complete (or that they never
// will). One BlockRunner per worker thread per launch; its fibers and stacks serve every block
// that worker runs.
#include "kernels/cuda/emu/emu.hpp"
#include "kernels/cuda/emu/fiber.hpp"

#include <string>
#include <vector>

namespace fp8serve::emu::detail {

struct Launch {
  KernelCall call;
  dim3 grid;
  dim3 block;
  size_t shared_bytes;  // dynamic shared memory per block
};

enum class Wait : uint8_t { runnable, warp, barrier, exited };

// One CUDA thread: its fiber and, while it waits, the operation it waits at.
struct CudaThread {
  Fiber fiber;
  uint3 index{};
  unsigned linear = 0;  // x + y * blockDim.x + z * blockDim.x * blockDim.y
  Wait wait = Wait::runnable;
  uint8_t op = 0;       // a WarpOp or a BarrierOp, by `wait`
  unsigned mask = 0;
  uint64_t value = 0;   // the shuffled value's bits, or the predicate (0 or 1)
  int lane_arg = 0;     // source lane, delta or lane mask
  int width = 32;
  Site site{};
  uint64_t result = 0;
};

class BlockRunner {
 public:
  explicit BlockRunner(const Launch& launch);
  ~BlockRunner();
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;

  // Runs block `block_linear` (x fastest) to its end, or aborts with a diagnostic.
  void run(uint64_t block_linear);

  // Fiber side, for the calling CUDA thread.
  uint64_t warp_op(CudaThread& self, WarpOp op, unsigned mask, uint64_t value, int lane_arg, int width, Site site);
  int barrier(CudaThread& self, BarrierOp op, int predicate, Site site);
  void* static_shared(const CudaThread& self, const void* key, size_t bytes, size_t align, Site site);
  void* dynamic_shared() const { return dynamic_shared_; }
  [[noreturn]] void fail(const CudaThread& thread, Site site, const char* op, const std::string& message) const;

 private:
  struct SharedVariable {
    const void* key;
    void* data;
    size_t align;
  };
  static void thread_body();
  CudaThread& lane(unsigned warp_first, unsigned lane) { return threads_[warp_first + lane]; }
  bool release_warp_groups();
  void complete_warp_group(unsigned warp_first, unsigned mask);
  bool release_barrier();
  void check_warp_groups_agree() const;
  [[noreturn]] void report_deadlock() const;
  std::string where(const CudaThread& thread) const;
  void free_shared();

  const Launch& launch_;
  std::vector<CudaThread> threads_;
  uint3 block_index_{};
  unsigned num_exited_ = 0;
  void* dynamic_shared_ = nullptr;
  std::vector<SharedVariable> static_shared_;
  size_t static_shared_bytes_ = 0;
};

// Whether the calling OS thread is running a block (a kernel may not launch kernels).
bool in_kernel();

}  // namespace fp8serve::emu::detail
