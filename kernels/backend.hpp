#pragma once
// The kernel interface the forward pass is written against (docs/design.md, "A new kernel"): one abstract
// Backend whose ops each take one params struct and a stream. The CPU backend
// (kernels/cpu/cpu_backend.hpp) runs them on its thread pool; a CUDA backend implements the
// same ops with device pointers in the same params structs and launches on the stream - the
// model code does not change. One virtual call per op per layer is noise next to the op itself.
//
// Memory: every pointer in a params struct is device memory obtained from allocate() (host
// memory on the CPU). The model uploads its weights and the KV pool lives there too, so the
// CUDA backend does the same with cudaMalloc; the engine never dereferences device pointers,
// it moves data with copy_to_device / copy_to_host.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/forward_ops.hpp"
#include "kernels/kv_spill.hpp"
#include "kernels/kv_write.hpp"
#include "kernels/paged_attention.hpp"
#include "kernels/sampling_ops.hpp"

namespace fp8serve {

// Element type of activations (q, k, v, hidden states): fp32 on the CPU, bf16 on the GPU.
enum class ActDtype : uint8_t { f32, bf16 };

// Device memory in bytes, as the driver reports it (cudaMemGetInfo).
struct DeviceMemory {
  std::size_t free = 0;
  std::size_t total = 0;
};

// An ordering queue for device work: cudaStream_t on CUDA, unused (null) on the CPU, where
// every op has finished when it returns. A null handle on CUDA is the backend's own stream (one
// non-blocking stream per backend), never CUDA's legacy default stream.
struct Stream {
  void* handle = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual ActDtype activation_dtype() const = 0;
  // One line for the start-up log: the device, its features and threads.
  virtual std::string describe() const = 0;
  // Whether linear() takes weights of this dtype (kernels/forward_ops.hpp, LinearParams). A
  // model refuses to load FP8 weights onto a backend without them, naming it.
  virtual bool supports_weight_dtype(WeightDtype dtype) const { return dtype == WeightDtype::bf16; }
  // Batch invariance: up to how many tokens per forward pass every kernel computes a token's row
  // exactly as it would in any other batch (0: at any size, as on the CPU). Speculative decoding's
  // verification keeps its steps within it (SchedulerOptions::max_speculative_step_tokens).
  virtual int64_t batch_invariant_tokens() const { return 0; }

  // Device memory. allocate() returns zeroed memory aligned for any kernel (64 bytes at
  // least) and throws std::bad_alloc when the device has none left; free(nullptr) is a no-op.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  // Copies are ordered on the stream. copy_to_device reads `src` before it returns (the caller
  // may reuse it at once); copy_to_host's `dst` holds the data once synchronize(stream) has
  // returned (a device backend copies asynchronously), so keep it alive until then.
  virtual void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  virtual void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  // Host memory that the copies above move directly: pinned on CUDA, so a copy to or from it is
  // one asynchronous DMA with no staging through the backend's own buffer; plain memory
  // elsewhere. Zeroed, 64-byte aligned; throws std::bad_alloc; free_host(nullptr) is a no-op.
  // For buffers a step copies every time (the logits, the step's metadata). Unlike other host
  // memory, a copy_to_device from it reads it when the stream gets there: leave it unchanged
  // until synchronize(stream) has returned.
  virtual void* allocate_host(std::size_t bytes);
  virtual void free_host(void* ptr);
  // Waits until all work queued on the stream has finished (a no-op on the CPU). A device
  // backend also reports here what its kernels found wrong in device data since the last call
  // (a token id outside the vocabulary, a slot outside the pool) by throwing.
  virtual void synchronize(Stream stream) = 0;
  // Free and total device memory, for sizing the KV pool from --gpu-memory-utilization;
  // nullopt where memory is the host's (the CPU backend).
  virtual std::optional<DeviceMemory> memory_info() const { return std::nullopt; }

  // Graphs (CUDA graphs): the ops issued on `stream` between begin_capture() and end_capture()
  // are recorded, not run; replay() runs them again, in order, with the arguments they had at
  // capture (pointers, sizes, grids). What may change between replays is only the contents of
  // device memory, so a caller rewrites its metadata in place before each replay. No copy,
  // allocation or synchronize() may happen inside a capture (the backend throws). A backend
  // without graphs (the CPU) says so and throws from all three.
  class Graph {
   public:
    virtual ~Graph() = default;
  };
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture(Stream /*stream*/) { throw std::logic_error("begin_capture: this backend has no graphs"); }
  virtual std::unique_ptr<Graph> end_capture(Stream /*stream*/) {
    throw std::logic_error("end_capture: this backend has no graphs");
  }
  virtual void replay(const Graph& /*graph*/, Stream /*stream*/) {
    throw std::logic_error("replay: this backend has no graphs");
  }

  // Allocates now what paged_attention() needs as workspace for steps of up to max_num_seqs
  // sequences of this shape and up to max_context tokens each, so that the memory is in use
  // before the KV pool is sized from what is left (a no-op where attention needs none, as on the
  // CPU).
  virtual void reserve_attention_workspace(int32_t /*max_num_seqs*/, int32_t /*num_heads*/, int32_t /*num_kv_heads*/,
                                           int32_t /*head_dim*/, int32_t /*max_context*/) {}

  // Copy-on-write of paged KV blocks: block src -> dst in K and V of every layer's pool (K
  // only where a view's v is null: a K-only tail pool). Also copies a forked sequence's tail
  // ring, block by block.
  virtual void copy_blocks(const CopyBlocksParams& params, Stream stream) = 0;

  // RoPE's cos/sin table, built once from the model's inv_freq for positions
  // [0, max_positions) and kept on the device; rope() reads it. Call before rope().
  virtual void set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) = 0;

  // The forward pass, in the order the model calls them (kernels/forward_ops.hpp).
  virtual void embedding(const EmbeddingParams& params, Stream stream) = 0;
  virtual void rms_norm(const RmsNormParams& params, Stream stream) = 0;
  virtual void linear(const LinearParams& params, Stream stream) = 0;
  virtual void rope(const RopeParams& params, Stream stream) = 0;
  virtual void head_hadamard(const HeadHadamardParams& params, Stream stream) = 0;
  // With the bf16 recent window, kv_spill runs before kv_write in every layer (paged_kv.hpp).
  virtual void kv_spill(const KvSpillParams& params, Stream stream) = 0;
  virtual void kv_write(const KvWriteParams& params, Stream stream) = 0;
  virtual void paged_attention(const PagedAttentionParams& params, Stream stream) = 0;
  virtual void silu_mul(const SiluMulParams& params, Stream stream) = 0;
  virtual void residual_add(const ResidualAddParams& params, Stream stream) = 0;
  virtual void gather_rows(const GatherRowsParams& params, Stream stream) = 0;

  // Sampling on the device (kernels/sampling_ops.hpp): a backend that has it picks tokens from
  // logits in its own memory, so that only the picks come back. Exactly the host sampler's
  // arithmetic (server/engine/sampling.cpp), which the CPU backend keeps using: it has none of these.
  virtual bool supports_device_sampling() const { return false; }
  // Greedy: each row's argmax (ties to the lowest id) and the row's max and ExpSum for its logprob.
  virtual void sample_greedy(const GreedySampleParams& /*params*/, Stream /*stream*/) {
    throw std::logic_error("sample_greedy: this backend samples on the host");
  }
  // The top-k prefilter: each row's K best candidates (ids ascending), its max, and the ExpSums
  // of the raw and the temperature-scaled row, from which the host draws as it would from the row.
  virtual void sample_candidates(const CandidateSampleParams& /*params*/, Stream /*stream*/) {
    throw std::logic_error("sample_candidates: this backend samples on the host");
  }
  // The host sampler's logit processors and penalties on the rows, in place, before either of
  // the above: each row's allow mask, then its edits (LogitEdit, the host's arithmetic).
  virtual void process_logits(const LogitProcessParams& /*params*/, Stream /*stream*/) {
    throw std::logic_error("process_logits: this backend samples on the host");
  }
};

inline void* Backend::allocate_host(std::size_t bytes) {
  void* p = ::operator new(bytes ? bytes : 1, std::align_val_t{64});
  std::memset(p, 0, bytes);
  return p;
}
inline void Backend::free_host(void* ptr) {
  if (ptr != nullptr) ::operator delete(ptr, std::align_val_t{64});
}

// Owns one allocate_host() buffer of a Backend (RAII); grows (keeping nothing) with reserve().
template <typename T>
class HostArray {
 public:
  HostArray() = default;
  explicit HostArray(Backend& backend) : backend_(&backend) {}
  ~HostArray() { reset(); }
  HostArray(HostArray&& other) noexcept { *this = std::move(other); }
  HostArray& operator=(HostArray&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;

  // Makes size() == n; contents are kept only while n fits the capacity (a new buffer is zeroed).
  void resize(std::size_t n) {
    if (n > capacity_) {
      reset();
      data_ = static_cast<T*>(backend_->allocate_host(n * sizeof(T)));
      capacity_ = n;
    }
    size_ = n;
  }
  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<T> span() const { return {data_, size_}; }

 private:
  void reset() {
    if (backend_ != nullptr && data_ != nullptr) backend_->free_host(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

// Owns one allocation of a Backend (RAII), so a throwing constructor leaks nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, std::size_t bytes)
      : backend_(&backend), ptr_(bytes ? backend.allocate(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      ptr_ = other.ptr_;
      bytes_ = other.bytes_;
      other.ptr_ = nullptr;
      other.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void reset() {
    if (backend_ && ptr_) backend_->free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace fp8serve
