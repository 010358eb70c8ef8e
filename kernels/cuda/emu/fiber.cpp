#include "kernels/cuda/emu/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FP8SERVE_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FP8SERVE_EMU_ASAN 1
#endif
#if defined(FP8SERVE_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace fp8serve::emu::detail {
namespace {

std::atomic<uint64_t> g_switches{0};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fp8serve CUDA emulator: %s\n", what);
  std::abort();
}

size_t page_bytes() {
  static const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}

// Stacks are few (workers x threads per block) and reused by every launch: a block of 1024
// threads would otherwise cost 2048 system calls.
class StackPool {
 public:
  char* take() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        char* stack = free_.back();
        free_.pop_back();
        return stack;
      }
    }
    const size_t guard = page_bytes();
    void* base = mmap(nullptr, guard + kFiberStackBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) die("cannot map a fiber stack");
    if (mprotect(base, guard, PROT_NONE) != 0) die("cannot protect a fiber stack's guard page");
    return static_cast<char*>(base) + guard;
  }

  void give_back(char* stack) {
    std::lock_guard lock(mutex_);
    free_.push_back(stack);
  }

 private:
  std::mutex mutex_;
  std::vector<char*> free_;
};

StackPool& stack_pool() {
  static StackPool* pool = new StackPool;  // never destroyed: fibers may outlive static destructors
  return *pool;
}

// The worker side of every switch on this OS thread.
thread_local ucontext_t t_worker_context;
thread_local Fiber* t_starting = nullptr;
#if defined(FP8SERVE_EMU_ASAN)
thread_local const void* t_worker_stack_bottom = nullptr;
thread_local size_t t_worker_stack_bytes = 0;
#endif

}  // namespace

uint64_t fiber_switch_count() { return g_switches.load(std::memory_order_relaxed); }

Fiber::Fiber() : stack_(stack_pool().take()) {}

Fiber::~Fiber() { stack_pool().give_back(stack_); }

void Fiber::reset(void (*body)()) {
  body_ = body;
  if (getcontext(&context_) != 0) die("getcontext failed");
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = kFiberStackBytes;
  context_.uc_link = nullptr;  // the body never returns through the trampoline's end
  makecontext(&context_, &Fiber::trampoline, 0);
  asan_fake_stack_ = nullptr;
}

void Fiber::resume() {
  g_switches.fetch_add(1, std::memory_order_relaxed);
  t_starting = this;
#if defined(FP8SERVE_EMU_ASAN)
  void* worker_fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&worker_fake_stack, stack_, kFiberStackBytes);
  swapcontext(&t_worker_context, &context_);
  __sanitizer_finish_switch_fiber(worker_fake_stack, nullptr, nullptr);
#else
  swapcontext(&t_worker_context, &context_);
#endif
}

void Fiber::suspend() {
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_start_switch_fiber(&asan_fake_stack_, t_worker_stack_bottom, t_worker_stack_bytes);
  swapcontext(&context_, &t_worker_context);
  __sanitizer_finish_switch_fiber(asan_fake_stack_, nullptr, nullptr);
#else
  swapcontext(&context_, &t_worker_context);
#endif
}

// A fiber's first frame: runs the body, then hands the stack back to the worker for good (the
// worker never resumes a finished fiber before reset()).
void Fiber::trampoline() {
  Fiber* self = t_starting;
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &t_worker_stack_bottom, &t_worker_stack_bytes);
#endif
  self->body_();
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_start_switch_fiber(nullptr, t_worker_stack_bottom, t_worker_stack_bytes);
#endif
  setcontext(&t_worker_context);
  die("setcontext returned");
}

}  // namespace fp8serve::emu::detail
