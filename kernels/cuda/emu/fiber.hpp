#pragma once
// One CUDA thread of the emulator: a ucontext fiber on its own stack (256 KiB above a PROT_NONE
// guard page, so an overflow faults instead of writing into a neighbour). A worker thread resumes
// its fibers one at a time; a fiber runs until it suspends (at a warp op or a barrier) or its
// function returns. Switches are annotated for AddressSanitizer, which otherwise loses track of
// which stack is live.
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

  ucontext_t context_{};
  void (*body_)() = nullptr;
  char* stack_ = nullptr;       // the usable stack, above the guard page
  void* asan_fake_stack_ = nullptr;
};

uint64_t fiber_switch_count();

}  // namespace fp8serve::emu::detail
