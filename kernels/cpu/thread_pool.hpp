#pragma once
// The CPU backend's one thread pool: created once at start-up with --threads threads and passed
// to every kernel that wants it (no global pool, STYLE.md habit 9).
//
// parallel_for(n, fn) runs fn(i) for every i in [0, n) and returns when all are done. The
// calling thread works too, so a pool of N threads starts N - 1 workers and a pool of 1 runs
// everything inline. Items are handed out dynamically (an atomic counter), so which thread runs
// an item is not deterministic: kernels keep their results deterministic by making each item's
// arithmetic independent of the schedule (fixed work split, fixed merge order).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fp8serve::cpu {

class ThreadPool {
 public:
  // num_threads: total threads working on a parallel_for, the caller included (>= 1).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // PRECOND: not called from inside fn (no nesting) and from one thread at a time (the engine
  // loop). The first exception thrown by fn is rethrown here after all items have stopped.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  void run_items();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // bumped for every parallel_for; workers wait for a change
  int active_workers_ = 0;   // workers that joined the current generation and are not done
  bool stopping_ = false;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_items_ = 0;
  std::atomic<int64_t> next_item_{0};
  std::exception_ptr error_;
};

}  // namespace fp8serve::cpu
