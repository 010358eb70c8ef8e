#pragma once
// The CPU backend's one thread pool: created once at start-up with --threads threads and passed
// to every kernel that wants it (no global pool, STYLE.md habit 9).
//
// parallel_for(n, fn) runs fn(i) for every i in [0, n) and returns when all are done. The
// calling thread works too, so a pool of N threads starts N - 1 workers and a pool of 1 runs
// everything inline. Items are handed out dynamically (an atomic counter), so which thread runs
// an item is not deterministic: kernels keep their results deterministic by making each item's
// arithmetic independent of the schedule (fixed work split, fixed merge order).
//
// Hand-off without the kernel's help. A batch-1 decode step of the default model is ~250
// parallel_for calls of 5-50 us each; waking a worker through a condition variable took 20-45 us
// per call on the 2-core development VM (the futex wake and the scheduler), as much as the work.
// So a worker that finishes a call spins (pause) on the pool's state word for up to spin_us
// before it sleeps, and the caller publishes a call with one atomic store; between the calls of a
// step nobody sleeps. The caller does not wait for workers that were not scheduled in time (an
// oversubscribed machine): a worker joins a call only while the caller is still handing out
// items, and the caller waits only for workers that joined.
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
  // spin_us: how long an idle worker spins before it sleeps (0: sleep at once).
  explicit ThreadPool(int num_threads, int spin_us = kDefaultSpinUs);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // PRECOND: not called from inside fn (no nesting) and from one thread at a time (the engine
  // loop). The first exception thrown by fn is rethrown here after all items have stopped.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

  // Longer than the gaps between the calls of one decode step (a few us), shorter than the time
  // the engine spends between steps when it has nothing to do.
  static constexpr int kDefaultSpinUs = 200;

 private:
  // state_: the call's generation in the high 32 bits; bit 31 set while the call is open for
  // workers to join; the number of workers inside the call in the low bits.
  static constexpr uint64_t kOpen = uint64_t{1} << 31;
  static constexpr uint64_t kCountMask = kOpen - 1;
  static uint32_t generation_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

  void worker_loop();
  // Waits for a call newer than `seen`; returns false when the pool stops.
  bool wait_for_call(uint32_t seen);
  void run_items();

  std::vector<std::thread> workers_;
  const int spin_us_;
  std::atomic<uint64_t> state_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;  // for sleeping workers only
  std::condition_variable wake_;

  // The current call, written by the caller before it opens the call.
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t num_items_ = 0;
  std::atomic<int64_t> next_item_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace fp8serve::cpu
