#include "kernels/cpu/thread_pool.hpp"

#include <immintrin.h>

#include <chrono>
#include <stdexcept>

namespace fp8serve::cpu {

namespace {

void cpu_relax() { _mm_pause(); }

}  // namespace

ThreadPool::ThreadPool(int num_threads, int spin_us) : spin_us_(spin_us < 0 ? 0 : spin_us) {
  if (num_threads < 1) throw std::invalid_argument("ThreadPool: --threads must be >= 1");
  workers_.reserve(static_cast<std::size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(mutex_);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run_items() {
  for (;;) {
    const int64_t i = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (i >= num_items_) return;
    try {
      (*fn_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
      next_item_.store(num_items_, std::memory_order_relaxed);  // stop handing out items
    }
  }
}

bool ThreadPool::wait_for_call(uint32_t seen) {
  auto has_call = [&] {
    return stopping_.load(std::memory_order_seq_cst) ||
           generation_of(state_.load(std::memory_order_seq_cst)) != seen;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  for (int i = 0; !has_call(); ++i) {
    cpu_relax();
    if ((i & 255) == 255 && std::chrono::steady_clock::now() >= deadline) {
      // Sleep. sleepers_ and state_ are seq_cst on both sides: either the caller sees this
      // sleeper and notifies (under the mutex), or this thread sees the new call in has_call().
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, has_call);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      break;
    }
  }
  return !stopping_.load(std::memory_order_seq_cst);
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  while (wait_for_call(seen)) {
    uint64_t state = state_.load(std::memory_order_acquire);
    seen = generation_of(state);
    // Join while the call is open: one more worker inside it. A call already closed (the
    // caller has handed out every item and waits) is skipped.
    bool joined = false;
    while ((state & kOpen) != 0 && generation_of(state) == seen) {
      if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    run_items();
    state_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // No worker is inside a call here (the previous one waited for them), so the call's fields can
  // be written; opening it with a new generation publishes them.
  fn_ = &fn;
  num_items_ = n;
  next_item_.store(0, std::memory_order_relaxed);
  const uint32_t generation = generation_of(state_.load(std::memory_order_relaxed)) + 1;
  state_.store((static_cast<uint64_t>(generation) << 32) | kOpen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }
    wake_.notify_all();
  }
  run_items();
  // Every item has been taken: close the call, then wait for the workers inside it. A worker
  // that was not scheduled in time finds it closed and stays out.
  uint64_t state = state_.fetch_and(~kOpen, std::memory_order_acq_rel) & ~kOpen;
  for (int i = 0; (state & kCountMask) != 0; ++i) {
    if (i < 4096) {
      cpu_relax();
    } else {
      std::this_thread::yield();  // a worker descheduled mid-item: give it the core
    }
    state = state_.load(std::memory_order_acquire);
  }
  fn_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(error_mutex_);
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fp8serve::cpu
