#pragma once
// The kernel interface the forward pass is written against (DESIGN.md §4-5): one abstract
// Backend whose ops each take one params struct and a stream. The CPU backend
// (kernels/cpu/cpu_backend.hpp) runs them on its thread pool; a CUDA backend will implement the
// same ops with device pointers in the same params structs and launch on the stream - the model
// code does not change. One virtual call per op per layer is noise next to the op itself.
#include <cstdint>
#include <string_view>

#include "kernels/kv_write.hpp"
#include "kernels/paged_attention.hpp"

namespace fp8serve {

// Element type of activations (q, k, v, hidden states): fp32 on the CPU, bf16 on the GPU.
enum class ActDtype : uint8_t { f32, bf16 };

// An ordering queue for device work: cudaStream_t on CUDA, unused (null) on the CPU, where
// every op has finished when it returns.
struct Stream {
  void* handle = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual ActDtype activation_dtype() const = 0;

  // Attention (issue 3).
  virtual void kv_write(const KvWriteParams& params, Stream stream) = 0;
  virtual void paged_attention(const PagedAttentionParams& params, Stream stream) = 0;

  // The rest of the forward pass (issue 4) joins here, one params struct per op in its own
  // header: embedding, rms_norm (and per-head q/k norm), rope, matmul (bf16 weights),
  // silu_mul, residual add, and the device memory verbs (alloc, copy in/out) a CUDA backend needs.
};

}  // namespace fp8serve
