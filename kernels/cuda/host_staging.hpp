#pragma once
// Pinned host staging for the CUDA backend's copies (kernels/cuda/cuda_backend.cu).
//
// A copy between the device and pageable memory (a std::vector, a span the engine hands over)
// cannot be asynchronous: the driver stages it through its own buffer and the call blocks. So
// the backend stages small copies itself, through one pinned arena: an upload memcpy's the
// source into the arena and queues cudaMemcpyAsync from there (the caller may reuse its memory
// at once); a download queues cudaMemcpyAsync into the arena and memcpy's to the caller's
// destination when the stream is synchronized. The arena is a bump allocator, emptied at every
// synchronize, so nothing in flight is ever overwritten; when a step needs more than it holds,
// the backend synchronizes and the arena grows to hold the whole step (doubling), so after the
// first steps it never allocates again. Buffers a step copies every time (the logits, the step's
// metadata) are better pinned themselves (Backend::allocate_host): they skip the arena.
#include <cstddef>
#include <vector>

namespace fp8serve::cuda {

class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // `bytes` of pinned memory (16-byte aligned) valid until reset(); nullptr when the arena
  // cannot hold them now (the caller synchronizes, reset()s and calls reserve()).
  void* take(std::size_t bytes);
  // Grows an empty arena to hold at least `bytes` (PRECOND: nothing taken since reset()).
  void reserve(std::size_t bytes);
  void reset() { used_ = 0; }
  // Bytes taken since the last reset (alignment included).
  std::size_t used() const { return used_; }

  // A download waiting for the stream: copy `bytes` from `staged` to `dst` once it has run.
  struct PendingCopy {
    void* dst;
    const void* staged;
    std::size_t bytes;
  };
  void defer(void* dst, const void* staged, std::size_t bytes) { pending_.push_back({dst, staged, bytes}); }
  // Completes the deferred downloads (PRECOND: the stream is synchronized) and empties the arena.
  void finish();

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::vector<PendingCopy> pending_;
};

}  // namespace fp8serve::cuda
