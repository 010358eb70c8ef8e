#pragma once
// The emulator's block scheduler: runs one block at a time of a launch on the calling OS thread,
// each CUDA thread a fiber, and decides when warp ops and barriers complete (or that they never
// will). One BlockRunner per worker thread per launch; its fibers and stacks serve every block
// that worker runs. Warp collectives (mma.sync) complete like warp ops; cp.async copies are
// deferred per thread (async_copy.cpp).
#include "tests/cuda_emu/emu.hpp"
#include "tests/cuda_emu/fiber.hpp"

#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

namespace fp8serve::emu::detail {

struct Launch {
  KernelCall call;
  dim3 grid;
  dim3 block;
  size_t shared_bytes;  // dynamic shared memory per block
  uint64_t sequence;    // the launch's number in this process: part of the thread-order seed
};

enum class Wait : uint8_t { runnable, warp, barrier, exited };

// Completes a warp collective from the 32 lanes' operands (lane i's at lanes[i]).
using CollectiveFn = void (*)(const void* const* lanes);

// One cp.async of 16 bytes: src_bytes read from src, the rest of dst zero-filled.
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int src_bytes;
  Site site;
};

// Landed bytes only the issuing thread may see yet: while another thread runs they are saved here
// and the destination holds 0xFF again.
struct LandedCopy {
  unsigned char* dst;
  unsigned char saved[16];
  Site site;
};

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
  CollectiveFn collective = nullptr;  // a warp collective's completion, with
  const void* payload = nullptr;      // this lane's operands and
  const char* collective_name = "";   // the instruction's name, for diagnostics
  // cp.async: copies issued since the last commit, committed groups in flight (oldest first),
  // and performed copies not yet made visible by a barrier.
  std::vector<AsyncCopy> open_copies;
  std::deque<std::vector<AsyncCopy>> copy_groups;
  std::vector<LandedCopy> landed;
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
  void warp_collective(CudaThread& self, CollectiveFn fn, const void* payload, const char* name, Site site);
  int barrier(CudaThread& self, BarrierOp op, int predicate, Site site);
  void* static_shared(const CudaThread& self, const void* key, size_t bytes, size_t align, Site site);
  void* dynamic_shared() const { return dynamic_shared_; }
  void cp_async_issue(CudaThread& self, void* smem, const void* gmem, int src_bytes, Site site);
  void cp_async_commit(CudaThread& self);
  void cp_async_wait(CudaThread& self, int n, Site site);
  [[noreturn]] void fail(const CudaThread& thread, Site site, const char* op, const std::string& message) const;

 private:
  struct SharedVariable {
    const void* key;
    void* data;
    size_t bytes;
    size_t align;
  };
  static void thread_body();
  CudaThread& lane(unsigned warp_first, unsigned lane) { return threads_[warp_first + lane]; }
  void next_round_order(uint64_t block_linear, uint64_t round);
  bool release_warp_groups();
  void complete_warp_group(unsigned warp_first, unsigned mask);
  bool release_barrier();
  void check_warp_groups_agree() const;
  [[noreturn]] void report_deadlock() const;
  std::string where(const CudaThread& thread) const;
  void free_shared();
  // cp.async (async_copy.cpp).
  bool in_shared_memory(const void* p, size_t bytes) const;
  void hide_landed(CudaThread& t);     // after t ran: its landed bytes leave shared memory
  void restore_landed(CudaThread& t);  // before t runs: they come back (checked untouched)
  void publish_landed(CudaThread& t);  // a barrier: they become everyone's
  void check_no_copies_in_flight(const CudaThread& t);

  const Launch& launch_;
  std::vector<CudaThread> threads_;
  std::vector<unsigned> order_;  // the round's order of threads
  uint3 block_index_{};
  unsigned num_exited_ = 0;
  void* dynamic_shared_ = nullptr;
  std::vector<SharedVariable> static_shared_;
  size_t static_shared_bytes_ = 0;
  // 16-byte granules of shared memory a cp.async holds (issued, or landed and not yet visible to
  // all), and the thread holding each.
  std::unordered_map<const unsigned char*, unsigned> copies_held_;
};

// Whether the calling OS thread is running a block (a kernel may not launch kernels).
bool in_kernel();

// Called from a fiber: wait until all 32 lanes of the warp reach this collective, from the same
// call site, then fn(the 32 lanes' payloads) runs once for the warp; aborts otherwise.
void warp_collective(CollectiveFn fn, const void* payload, const char* name, Site site);

}  // namespace fp8serve::emu::detail
