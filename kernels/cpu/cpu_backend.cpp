#include "kernels/cpu/cpu_backend.hpp"

#include "kernels/cpu/kv_write_cpu.hpp"

namespace fp8serve::cpu {

void CpuBackend::kv_write(const KvWriteParams& params, Stream /*stream*/) { kv_write_cpu(params, pool_); }

void CpuBackend::paged_attention(const PagedAttentionParams& params, Stream /*stream*/) {
  paged_attention_cpu(params, pool_, attention_workspace_);
}

}  // namespace fp8serve::cpu
