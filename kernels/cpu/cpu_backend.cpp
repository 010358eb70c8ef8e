#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/host_memory.hpp"

#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kv_spill_cpu.hpp"
#include "kernels/cpu/kv_write_cpu.hpp"
#include "kernels/cpu/linear.hpp"

namespace fp8serve::cpu {

std::string CpuBackend::describe() const {
  return "cpu (" + cpu::describe(cpu_features()) + "; linear " + linear_isa_name(linear_isa_) +
         "), " + std::to_string(pool_.num_threads()) + " threads";
}

void* CpuBackend::allocate(std::size_t bytes) { return cpu::allocate_host_memory(bytes); }

void CpuBackend::free(void* ptr) { cpu::free_host_memory(ptr); }

void CpuBackend::copy_to_device(void* dst, const void* src, std::size_t bytes, Stream /*stream*/) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::copy_to_host(void* dst, const void* src, std::size_t bytes, Stream /*stream*/) {
  if (bytes) std::memcpy(dst, src, bytes);
}

void CpuBackend::copy_blocks(const CopyBlocksParams& p, Stream /*stream*/) {
  for (int32_t layer = 0; layer < p.num_layers; ++layer) {
    const PagedKvView& view = p.layers[layer];
    const std::size_t elem = kv_dtype_size(view.dtype);
    // A packed view keeps a block contiguous: block_stride elements from its first one.
    if (view.block_stride != view.head_stride * view.num_kv_heads ||
        view.head_stride != static_cast<int64_t>(view.block_size) * view.v_token_stride) {
      throw std::invalid_argument("copy_blocks: needs a densely packed KV view");
    }
    const std::size_t block_bytes = static_cast<std::size_t>(view.block_stride) * elem;
    for (int32_t i = 0; i < p.num_copies; ++i) {
      if (p.src[i] < 0 || p.src[i] >= view.num_blocks || p.dst[i] < 0 || p.dst[i] >= view.num_blocks) {
        throw std::out_of_range("copy_blocks: block id outside the pool");
      }
      for (void* base : {view.k, view.v}) {
        if (base == nullptr) continue;  // a K-only tail pool
        auto* bytes = static_cast<unsigned char*>(base);
        std::memcpy(bytes + p.dst[i] * block_bytes, bytes + p.src[i] * block_bytes, block_bytes);
      }
    }
  }
}

void CpuBackend::set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) {
  rope_table_ = make_rope_table(inv_freq, max_positions);
}

void CpuBackend::embedding(const EmbeddingParams& p, Stream /*stream*/) {
  embedding_cpu(p, pool_);
}

void CpuBackend::rms_norm(const RmsNormParams& p, Stream /*stream*/) { rms_norm_cpu(p, pool_); }

void CpuBackend::linear(const LinearParams& p, Stream /*stream*/) {
  linear_cpu(p, pool_, linear_workspace_, linear_isa_);
}

void CpuBackend::rope(const RopeParams& p, Stream /*stream*/) {
  if (rope_table_.max_positions == 0) throw std::logic_error("rope: set_rope_table() was not called");
  if (p.rotate_heads == 0) return rope_cpu(p, rope_table_, pool_);
  const HeadHadamardParams rotation = rope_rotation(p, sizeof(float));
  rope_cpu(p, rope_table_, pool_);
  head_hadamard_cpu(rotation, pool_);
}

void CpuBackend::kv_spill(const KvSpillParams& p, Stream /*stream*/) { kv_spill_cpu(p, pool_); }

void CpuBackend::kv_write(const KvWriteParams& p, Stream /*stream*/) { kv_write_cpu(p, pool_); }

void CpuBackend::paged_attention(const PagedAttentionParams& p, Stream /*stream*/) {
  paged_attention_cpu(p, pool_, attention_workspace_, attention_isa_);
}

void CpuBackend::head_hadamard(const HeadHadamardParams& p, Stream /*stream*/) { head_hadamard_cpu(p, pool_); }
void CpuBackend::silu_mul(const SiluMulParams& p, Stream /*stream*/) { silu_mul_cpu(p, pool_); }

void CpuBackend::residual_add(const ResidualAddParams& p, Stream /*stream*/) {
  residual_add_cpu(p, pool_);
}

void CpuBackend::gather_rows(const GatherRowsParams& p, Stream /*stream*/) { gather_rows_cpu(p); }

}  // namespace fp8serve::cpu
