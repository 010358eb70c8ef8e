#pragma once
// One CUDA thread of the emulator: a fiber on its own stack (256 KiB above a PROT_NONE guard page,
// so an overflow faults instead of writing into a neighbour). A worker thread resumes its fibers
// one at a time; a fiber runs until it suspends (at a warp op or a barrier) or its function
// returns. On x86-64 a switch is a few instructions of our own (the callee-saved registers, the
// stack pointer, MXCSR and the x87 control word: what the System V ABI has a called function
// preserve); elsewhere it is ucontext's swapcontext, which also makes a sigprocmask system call
// per switch (bench_cuda_emu compares them). Switches are annotated for AddressSanitizer, which
// otherwise loses track of which stack is live.
#include <ucontext.h>

#include <cstddef>
#include <cstdint>

namespace fp8serve::emu::detail {

constexpr size_t kFiberStackBytes = 256 * 1024;

class Fiber {
 public:
  Fiber();  // takes a stack from a process-wide pool (stacks are reused, never unmapped)
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Makes the next resume() start `body` from the top of the stack. Only while not running.
  void reset(void (*body)());
  // On the worker: runs the fiber until it suspends or finishes.
  void resume();
  // On the fiber: back to the worker; returns when the worker resumes it again.
  void suspend();

 private:
  static void trampoline();

#if defined(__x86_64__)
  void* stack_pointer_ = nullptr;  // the fiber's saved stack pointer while it is not running
#else
  ucontext_t context_{};
#endif
  void (*body_)() = nullptr;
  char* stack_ = nullptr;       // the usable stack, above the guard page
  void* asan_fake_stack_ = nullptr;
};

uint64_t fiber_switch_count();

}  // namespace fp8serve::emu::detail
