#include "kernels/cpu/thread_pool.hpp"

#include <stdexcept>

namespace fp8serve::cpu {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads < 1) throw std::invalid_argument("ThreadPool: --threads must be >= 1");
  workers_.reserve(static_cast<std::size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
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
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_item_.store(num_items_, std::memory_order_relaxed);  // stop handing out items
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      // A worker that wakes after the others took every item stays out: the caller does not
      // wait for threads that were not scheduled in time (an oversubscribed machine).
      if (next_item_.load(std::memory_order_relaxed) >= num_items_) continue;
      ++active_workers_;
    }
    run_items();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --active_workers_;
    }
    done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    num_items_ = n;
    next_item_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    // Every item has been taken; wait for the workers still running one. fn_ is not touched
    // by any other worker from here: they find no item left when they wake.
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_workers_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fp8serve::cpu
