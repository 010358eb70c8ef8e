#pragma once
// The CPU implementation of the kernel interface: fp32 activations, host memory as "device"
// memory, every op on the one thread pool it is given (created once from --threads by whoever
// builds the engine). The ops themselves live in kernels/cpu/ops.hpp and linear.hpp and take the
// same params structs; this class forwards to them and owns their state (rope table, workspace).
#include <memory>
#include <string>
#include <string_view>

#include "kernels/backend.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/paged_attention_cpu.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace fp8serve::cpu {

class CpuBackend final : public Backend {
 public:
  // attention_isa / linear_isa: which paged-attention and projection builds to run (best =
  // avx512bf16 where the CPU has it; tests and benchmarks pass avx512 to compare with the fp32
  // ones).
  explicit CpuBackend(ThreadPool& pool, CpuIsa attention_isa = CpuIsa::best,
                      LinearIsa linear_isa = LinearIsa::best)
      : pool_(pool), attention_isa_(attention_isa), linear_isa_(linear_isa) {}

  std::string_view name() const override { return "cpu"; }
  ActDtype activation_dtype() const override { return ActDtype::f32; }
  std::string describe() const override;
  bool supports_weight_dtype(WeightDtype /*dtype*/) const override { return true; }

  void* allocate(std::size_t bytes) override;
  void free(void* ptr) override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void synchronize(Stream /*stream*/) override {}
  void copy_blocks(const CopyBlocksParams& params, Stream stream) override;
  void set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) override;

  void embedding(const EmbeddingParams& params, Stream stream) override;
  void rms_norm(const RmsNormParams& params, Stream stream) override;
  void linear(const LinearParams& params, Stream stream) override;
  void rope(const RopeParams& params, Stream stream) override;
  void head_hadamard(const HeadHadamardParams& params, Stream stream) override;
  void kv_spill(const KvSpillParams& params, Stream stream) override;
  void kv_write(const KvWriteParams& params, Stream stream) override;
  void paged_attention(const PagedAttentionParams& params, Stream stream) override;
  void silu_mul(const SiluMulParams& params, Stream stream) override;
  void residual_add(const ResidualAddParams& params, Stream stream) override;
  void gather_rows(const GatherRowsParams& params, Stream stream) override;

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool& pool_;
  CpuIsa attention_isa_;
  LinearIsa linear_isa_;
  AttentionWorkspace attention_workspace_;  // reused by every layer of every step
  LinearWorkspace linear_workspace_;
  RopeTable rope_table_;
};

}  // namespace fp8serve::cpu
