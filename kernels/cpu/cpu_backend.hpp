#pragma once
// The CPU implementation of the kernel interface: fp32 activations, every op on the one thread
// pool it is given (created once from --threads by whoever builds the engine).
#include <string_view>

#include "kernels/backend.hpp"
#include "kernels/cpu/paged_attention_cpu.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace fp8serve::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool) : pool_(pool) {}

  std::string_view name() const override { return "cpu"; }
  ActDtype activation_dtype() const override { return ActDtype::f32; }

  void kv_write(const KvWriteParams& params, Stream stream) override;
  void paged_attention(const PagedAttentionParams& params, Stream stream) override;

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool& pool_;
  AttentionWorkspace attention_workspace_;  // reused by every layer of every step
};

}  // namespace fp8serve::cpu
