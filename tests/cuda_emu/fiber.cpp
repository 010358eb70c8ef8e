#include "tests/cuda_emu/fiber.hpp"

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
#if defined(__x86_64__)
thread_local void* t_worker_stack_pointer = nullptr;
#else
thread_local ucontext_t t_worker_context;
#endif
thread_local Fiber* t_starting = nullptr;
#if defined(FP8SERVE_EMU_ASAN)
thread_local const void* t_worker_stack_bottom = nullptr;
thread_local size_t t_worker_stack_bytes = 0;
#endif

}  // namespace

#if defined(__x86_64__)
// fp8serve_emu_switch(save, next): pushes what a callee must preserve onto the current stack,
// stores the stack pointer in *save, switches to the stack `next` and pops the same from it, then
// returns to whatever that stack called the switch from (or, for a new fiber, to its entry).
extern "C" void fp8serve_emu_switch(void** save, void* next);
asm(R"(
  .text
  .globl fp8serve_emu_switch
  .type fp8serve_emu_switch, @function
fp8serve_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size fp8serve_emu_switch, .-fp8serve_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

uint64_t fiber_switch_count() { return g_switches.load(std::memory_order_relaxed); }

Fiber::Fiber() : stack_(stack_pool().take()) {}

Fiber::~Fiber() { stack_pool().give_back(stack_); }

namespace {

#if defined(__x86_64__)
void switch_to_fiber(void*& fiber_sp) { fp8serve_emu_switch(&t_worker_stack_pointer, fiber_sp); }
void switch_to_worker(void*& fiber_sp) { fp8serve_emu_switch(&fiber_sp, t_worker_stack_pointer); }
#endif

}  // namespace

void Fiber::reset(void (*body)()) {
  body_ = body;
#if defined(__x86_64__)
  // A frame as fp8serve_emu_switch leaves it, returning into trampoline() as if called: the
  // return address 16-byte aligned + 8 below the top, the saved registers zero, MXCSR and the
  // x87 control word as this thread has them.
  auto* top = reinterpret_cast<uint64_t*>(stack_ + kFiberStackBytes);
  uint64_t* sp = top - 9;
  uint32_t mxcsr = 0;
  uint16_t fpu_control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_control));
  sp[0] = mxcsr | (uint64_t{fpu_control} << 32);
  for (int i = 1; i <= 6; ++i) sp[i] = 0;  // r15, r14, r13, r12, rbx, rbp
  sp[7] = reinterpret_cast<uint64_t>(&Fiber::trampoline);
  sp[8] = 0;  // trampoline's own return address: it never returns
  stack_pointer_ = sp;
#else
  if (getcontext(&context_) != 0) die("getcontext failed");
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = kFiberStackBytes;
  context_.uc_link = nullptr;  // the body never returns through the trampoline's end
  makecontext(&context_, &Fiber::trampoline, 0);
#endif
  asan_fake_stack_ = nullptr;
}

void Fiber::resume() {
  g_switches.fetch_add(1, std::memory_order_relaxed);
  t_starting = this;
#if defined(FP8SERVE_EMU_ASAN)
  void* worker_fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&worker_fake_stack, stack_, kFiberStackBytes);
#endif
#if defined(__x86_64__)
  switch_to_fiber(stack_pointer_);
#else
  swapcontext(&t_worker_context, &context_);
#endif
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(worker_fake_stack, nullptr, nullptr);
#endif
}

void Fiber::suspend() {
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_start_switch_fiber(&asan_fake_stack_, t_worker_stack_bottom, t_worker_stack_bytes);
#endif
#if defined(__x86_64__)
  switch_to_worker(stack_pointer_);
#else
  swapcontext(&context_, &t_worker_context);
#endif
#if defined(FP8SERVE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(asan_fake_stack_, nullptr, nullptr);
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
#if defined(__x86_64__)
  void* finished = nullptr;  // never resumed: reset() builds a fresh frame
  fp8serve_emu_switch(&finished, t_worker_stack_pointer);
#else
  setcontext(&t_worker_context);
#endif
  die("a finished fiber was resumed");
}

}  // namespace fp8serve::emu::detail
