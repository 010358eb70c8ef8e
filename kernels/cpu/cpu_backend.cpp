#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/host_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/kv_write_cpu.hpp"
#include "kernels/cpu/linear.hpp"

namespace fp8serve::cpu {

namespace {

// 64 bytes: one cache line and one AVX-512 register, so no kernel load straddles two lines.

const float* f32(const void* p) { return static_cast<const float*>(p); }
float* f32(void* p) { return static_cast<float*>(p); }

}  // namespace

std::string CpuBackend::describe() const {
  return "cpu (" + cpu::describe(cpu_features()) + "; linear " + linear_isa_name(linear_best_isa()) +
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
        view.head_stride != static_cast<int64_t>(view.block_size) * view.token_stride) {
      throw std::invalid_argument("copy_blocks: needs a densely packed KV view");
    }
    const std::size_t block_bytes = static_cast<std::size_t>(view.block_stride) * elem;
    for (int32_t i = 0; i < p.num_copies; ++i) {
      if (p.src[i] < 0 || p.src[i] >= view.num_blocks || p.dst[i] < 0 || p.dst[i] >= view.num_blocks) {
        throw std::out_of_range("copy_blocks: block id outside the pool");
      }
      for (void* base : {view.k, view.v}) {
        auto* bytes = static_cast<unsigned char*>(base);
        std::memcpy(bytes + p.dst[i] * block_bytes, bytes + p.src[i] * block_bytes, block_bytes);
      }
    }
  }
}

void CpuBackend::set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) {
  rope_table_ = make_rope_table(inv_freq, max_positions);
}

void CpuBackend::embedding(const EmbeddingOpParams& p, Stream /*stream*/) {
  EmbeddingParams e;
  e.table = p.table;
  e.token_ids = p.token_ids;
  e.out = f32(p.out);
  e.num_tokens = p.num_tokens;
  e.vocab_size = p.vocab_size;
  e.hidden = p.hidden;
  embedding_cpu(e, pool_);
}

void CpuBackend::rms_norm(const RmsNormOpParams& p, Stream /*stream*/) {
  RmsNormParams r;
  r.x = f32(p.x);
  r.weight = p.weight;
  r.out = f32(p.out);
  r.num_tokens = p.num_tokens;
  r.num_heads = p.num_heads;
  r.dim = p.dim;
  r.x_token_stride = p.x_token_stride;
  r.out_token_stride = p.out_token_stride;
  r.eps = p.eps;
  rms_norm_cpu(r, pool_);
}

void CpuBackend::linear(const LinearOpParams& p, Stream /*stream*/) {
  LinearParams l;
  l.x = f32(p.x);
  l.weight = p.weight;
  l.bias = p.bias;
  l.y = f32(p.y);
  l.num_tokens = p.num_tokens;
  l.in_features = p.in_features;
  l.out_features = p.out_features;
  l.x_stride = p.x_stride;
  l.y_stride = p.y_stride;
  linear_cpu(l, pool_);
}

void CpuBackend::rope(const RopeOpParams& p, Stream /*stream*/) {
  if (rope_table_.max_positions == 0) throw std::logic_error("rope: set_rope_table() was not called");
  RopeParams r;
  r.q = f32(p.q);
  r.k = f32(p.k);
  r.positions = p.positions;
  r.num_tokens = p.num_tokens;
  r.num_q_heads = p.num_q_heads;
  r.num_kv_heads = p.num_kv_heads;
  r.head_dim = p.head_dim;
  r.q_token_stride = p.q_token_stride;
  r.k_token_stride = p.k_token_stride;
  rope_cpu(r, rope_table_, pool_);
}

void CpuBackend::kv_write(const KvWriteParams& params, Stream /*stream*/) { kv_write_cpu(params, pool_); }

void CpuBackend::paged_attention(const PagedAttentionParams& params, Stream /*stream*/) {
  paged_attention_cpu(params, pool_, attention_workspace_);
}

void CpuBackend::silu_mul(const SiluMulOpParams& p, Stream /*stream*/) {
  SiluMulParams s;
  s.gate = f32(p.gate);
  s.up = f32(p.up);
  s.out = f32(p.out);
  s.num_tokens = p.num_tokens;
  s.dim = p.dim;
  s.gate_token_stride = p.gate_token_stride;
  s.up_token_stride = p.up_token_stride;
  s.out_token_stride = p.out_token_stride;
  silu_mul_cpu(s, pool_);
}

void CpuBackend::residual_add(const ResidualAddOpParams& p, Stream /*stream*/) {
  residual_add_cpu(f32(p.residual), f32(p.x), p.num_elements, pool_);
}

void CpuBackend::gather_rows(const GatherRowsOpParams& p, Stream /*stream*/) {
  gather_rows_cpu(f32(p.x), p.num_x_rows, p.dim, p.rows, p.num_rows, f32(p.out));
}

}  // namespace fp8serve::cpu
