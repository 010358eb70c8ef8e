// Streams and events in the emulator: asynchronous queues, run as late as CUDA allows.
//
// Every launch, copy, memset, event record and cuBLASLt call is an operation queued on its stream
// (enqueue), and nothing runs until the host synchronises with it: cudaStreamSynchronize,
// cudaEventSynchronize, cudaDeviceSynchronize, a synchronous copy that must see the data, or a
// call that implicitly synchronises the device (cudaFree). Then the operation runs on the calling
// host thread, after everything it depends on:
// - the operations before it on its stream;
// - on the legacy default stream (0, cudaStreamLegacy): the work already queued on every blocking
//   stream (created without cudaStreamNonBlocking, cudaStreamPerThread included), and on a
//   blocking stream the work already queued on the legacy stream - CUDA's legacy-stream
//   semantics; non-blocking streams are ordered with nothing but their own events;
// - cudaStreamWaitEvent: the operation the event recorded.
// So a missing stream synchronisation, an event never waited for, or a kernel on a non-blocking
// stream reading what a legacy-stream copy writes reads old memory (or 0xFF where the copy
// poisoned its destination: runtime.cpp), every run. Queries make progress: cudaStreamQuery and
// cudaEventQuery of unfinished work run it and return cudaErrorNotReady (the next one succeeds).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "tests/cuda_emu/emu.hpp"
#include "tests/cuda_emu/runtime.hpp"

namespace fp8serve::emu::detail {
namespace {

struct Operation {
  std::function<void()> work;
  const void* stream;
  std::vector<uint64_t> after;  // operations of other streams that must run first
  bool running = false;
};

struct Queue {
  bool blocking = true;          // synchronises with the legacy default stream
  std::deque<uint64_t> pending;  // this stream's operations not yet run, in order
};

struct Event {
  bool timing;
  uint64_t operation = 0;  // the marker operation of the last record; 0: never recorded
  bool reached = false;
  std::chrono::steady_clock::time_point when{};
};

struct Streams {
  std::mutex mutex;
  std::condition_variable finished;  // an operation ran (for threads waiting on another's run)
  uint64_t next_id = 1;
  std::map<uint64_t, Operation> operations;  // not yet run
  std::map<const void*, Queue> queues;       // created streams; the legacy stream is key nullptr
  std::map<const void*, Event> events;
};

Streams& streams() {
  static Streams* s = new Streams;  // never destroyed: work may be synchronised from static destructors
  return *s;
}

// The queue key of a stream handle: the legacy stream for 0 and cudaStreamLegacy.
const void* key_of(cudaStream_t stream) { return stream == cudaStreamLegacy ? nullptr : stream; }

bool valid(const Streams& s, cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread || s.queues.count(stream) != 0;
}

Queue& queue_of(Streams& s, cudaStream_t stream) {
  const void* key = key_of(stream);
  auto it = s.queues.find(key);
  if (it == s.queues.end()) it = s.queues.emplace(key, Queue{}).first;  // legacy, per-thread
  return it->second;
}

uint64_t last_of(const Queue& q) { return q.pending.empty() ? 0 : q.pending.back(); }

// An operation that can run now on the way to running `id` (every one before it on its stream
// and everything it waits for run first), or 0 when `id` has run. `busy` is set when the one
// found is being run by another host thread.
uint64_t next_runnable(Streams& s, uint64_t id, bool& busy) {
  for (;;) {
    const auto it = s.operations.find(id);
    if (it == s.operations.end()) return 0;
    const Queue& q = s.queues.at(it->second.stream);
    if (q.pending.front() != id) {
      id = q.pending.front();
      continue;
    }
    bool waits = false;
    for (uint64_t dep : it->second.after)
      if (s.operations.count(dep) != 0) {
        id = dep;
        waits = true;
        break;
      }
    if (waits) continue;
    busy = it->second.running;
    return id;
  }
}

// Runs operation `id` and everything it depends on, on the calling thread.
void complete(std::unique_lock<std::mutex>& lock, uint64_t id) {
  Streams& s = streams();
  for (;;) {
    bool busy = false;
    const uint64_t next = next_runnable(s, id, busy);
    if (next == 0) return;
    if (busy) {
      s.finished.wait(lock);
      continue;
    }
    Operation& op = s.operations.at(next);
    op.running = true;
    std::function<void()> work = std::move(op.work);
    lock.unlock();
    work();  // kernels, copies: they may call into the runtime
    lock.lock();
    Queue& q = s.queues.at(s.operations.at(next).stream);
    q.pending.pop_front();
    s.operations.erase(next);
    s.finished.notify_all();
  }
}

void complete_queue(std::unique_lock<std::mutex>& lock, const void* key) {
  Streams& s = streams();
  const auto it = s.queues.find(key);
  if (it != s.queues.end()) complete(lock, last_of(it->second));
}

}  // namespace

cudaError_t check_stream(cudaStream_t stream) {
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  return valid(s, stream) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> work, uint64_t* id_out) {
  if (is_capturing(stream)) {
    record_node(stream, std::move(work));
    return cudaSuccess;
  }
  Streams& s = streams();
  std::lock_guard lock(s.mutex);
  if (!valid(s, stream)) return record_error(cudaErrorInvalidResourceHandle);
  Queue& q = queue_of(s, stream);
  Operation op{std::move(work), key_of(stream), {}};
  if (key_of(stream) == nullptr) {
    for (const auto& [key, other] : s.queues)
      if (key != nullptr && other.blocking && !other.pending.empty()) op.after.push_back(other.pending.back());
  } else if (q.blocking) {
    if (const uint64_t legacy = last_of(queue_of(s, nullptr)); legacy != 0) op.after.push_back(legacy);
  }
  const uint64_t id = s.next_id++;
  s.operations.emplace(id, std::move(op));
  q.pending.push_back(id);
  if (id_out != nullptr) *id_out = id;
  return cudaSuccess;
}

void complete_stream(cudaStream_t stream) {
  Streams& s = streams();
  std::unique_lock lock(s.mutex);
  complete_queue(lock, key_of(stream));
}

void complete_all() {
  Streams& s = streams();
  std::unique_lock lock(s.mutex);
  std::vector<uint64_t> lasts;
  for (const auto& [key, q] : s.queues)
    if (!q.pending.empty()) lasts.push_back(q.pending.back());
  for (uint64_t id : lasts) complete(lock, id);
}

}  // namespace fp8serve::emu::detail

using fp8serve::emu::detail::record_error;
namespace d = fp8serve::emu::detail;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return record_error(cudaErrorInvalidValue);
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  *stream = reinterpret_cast<cudaStream_t>(new char);  // a unique handle
  s.queues.emplace(*stream, d::Queue{(flags & cudaStreamNonBlocking) == 0, {}});
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

// CUDA returns at once and releases the stream once its work is done; here the work runs first.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  auto& s = d::streams();
  std::unique_lock lock(s.mutex);
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread || s.queues.count(stream) == 0)
    return record_error(cudaErrorInvalidResourceHandle);
  d::complete_queue(lock, stream);
  s.queues.erase(stream);
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (const cudaError_t err = d::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  if (const cudaError_t err = d::check_stream(stream); err != cudaSuccess) return record_error(err);
  d::complete_stream(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (const cudaError_t err = d::check_stream(stream); err != cudaSuccess) return record_error(err);
  auto& s = d::streams();
  std::unique_lock lock(s.mutex);
  const auto it = s.queues.find(d::key_of(stream));
  if (it == s.queues.end() || it->second.pending.empty()) return cudaSuccess;
  d::complete_queue(lock, d::key_of(stream));
  return cudaErrorNotReady;  // not an error state: cudaGetLastError stays clean
}

cudaError_t cudaDeviceSynchronize(void) {
  if (const cudaError_t err = d::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  d::complete_all();
  return cudaSuccess;
}

// Events: a record is a marker operation on the stream; the time is when it runs.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return record_error(cudaErrorInvalidValue);
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  *event = reinterpret_cast<cudaEvent_t>(new char);
  s.events.emplace(*event, d::Event{(flags & cudaEventDisableTiming) == 0});
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  if (s.events.erase(event) == 0) return record_error(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<char*>(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  {
    auto& s = d::streams();
    std::lock_guard lock(s.mutex);
    if (s.events.count(event) == 0 || !d::valid(s, stream)) return record_error(cudaErrorInvalidResourceHandle);
  }
  if (d::is_capturing(stream)) return record_error(cudaErrorNotSupported);  // event nodes: not emulated
  auto marker = std::make_shared<uint64_t>(0);
  const cudaError_t err = d::enqueue(
      stream,
      [event, marker] {
        auto& s = d::streams();
        std::lock_guard lock(s.mutex);
        const auto it = s.events.find(event);
        if (it == s.events.end() || it->second.operation != *marker) return;  // destroyed or recorded again
        it->second.reached = true;
        it->second.when = std::chrono::steady_clock::now();
      },
      marker.get());
  if (err != cudaSuccess) return record_error(err);
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  d::Event& e = s.events.at(event);
  e.operation = *marker;
  e.reached = false;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (const cudaError_t err = d::refuse_during_capture(); err != cudaSuccess) return record_error(err);
  auto& s = d::streams();
  std::unique_lock lock(s.mutex);
  const auto it = s.events.find(event);
  if (it == s.events.end()) return record_error(cudaErrorInvalidResourceHandle);
  d::complete(lock, it->second.operation);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto& s = d::streams();
  std::unique_lock lock(s.mutex);
  const auto it = s.events.find(event);
  if (it == s.events.end()) return record_error(cudaErrorInvalidResourceHandle);
  if (s.operations.count(it->second.operation) == 0) return cudaSuccess;
  d::complete(lock, it->second.operation);
  return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  uint64_t waited = 0;
  {
    auto& s = d::streams();
    std::lock_guard lock(s.mutex);
    const auto it = s.events.find(event);
    if (it == s.events.end() || !d::valid(s, stream)) return record_error(cudaErrorInvalidResourceHandle);
    waited = it->second.operation;
  }
  if (d::is_capturing(stream)) return record_error(cudaErrorNotSupported);
  if (waited == 0) return cudaSuccess;  // an event never recorded is complete
  if (const cudaError_t err = d::enqueue(stream, [] {}); err != cudaSuccess) return record_error(err);
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  s.operations.at(d::last_of(s.queues.at(d::key_of(stream)))).after.push_back(waited);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return record_error(cudaErrorInvalidValue);
  auto& s = d::streams();
  std::lock_guard lock(s.mutex);
  const auto a = s.events.find(start), b = s.events.find(end);
  if (a == s.events.end() || b == s.events.end() || !a->second.timing || !b->second.timing)
    return record_error(cudaErrorInvalidResourceHandle);
  if (a->second.operation == 0 || b->second.operation == 0) return record_error(cudaErrorInvalidResourceHandle);
  if (!a->second.reached || !b->second.reached) return record_error(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->second.when - a->second.when).count();
  return cudaSuccess;
}
