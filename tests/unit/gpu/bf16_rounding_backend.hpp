#pragma once
// A test-only Backend: the CPU backend with every activation rounded to bf16 where the CUDA
// backend stores one - after each op, its outputs; the fused residual norm split into the add,
// the rounding of the stream, then the norm of the rounded stream, as the CUDA kernel does. Its
// arithmetic is otherwise the CPU's fp32, so the CUDA forward pass must agree with it far more
// tightly than with the plain fp32 CPU backend: what remains is summation order and expf, which
// can flip a bf16 (or FP8) rounding only for values within ~2^-20 of a boundary.
// FP8 weights with more than 16 tokens in a shape cuBLASLt's FP8 GEMM takes: the CUDA backend
// quantizes x to E4M3 per token (or per token and 128-input block) first; so does this backend,
// with the same codec (kernels/fp8_quantize.hpp), before the CPU's FP8 linear.
#include <cmath>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/linear_cublaslt.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/fp8_quantize.hpp"

namespace fp8serve::gpu_test {

class Bf16RoundingBackend final : public Backend {
 public:
  Bf16RoundingBackend() : pool_(2), cpu_(pool_) {}

  std::string_view name() const override { return "cpu (bf16 activations)"; }
  ActDtype activation_dtype() const override { return ActDtype::f32; }
  std::string describe() const override { return cpu_.describe() + ", activations rounded to bf16"; }
  void* allocate(std::size_t bytes) override { return cpu_.allocate(bytes); }
  void free(void* ptr) override { cpu_.free(ptr); }
  bool supports_weight_dtype(WeightDtype d) const override { return cpu_.supports_weight_dtype(d); }
  void copy_to_device(void* d, const void* s, std::size_t n, Stream st) override { cpu_.copy_to_device(d, s, n, st); }
  void copy_to_host(void* d, const void* s, std::size_t n, Stream st) override { cpu_.copy_to_host(d, s, n, st); }
  void synchronize(Stream) override {}
  void copy_blocks(const CopyBlocksParams& p, Stream st) override { cpu_.copy_blocks(p, st); }
  void set_rope_table(const std::vector<float>& f, int64_t n) override { cpu_.set_rope_table(f, n); }
  void kv_spill(const KvSpillParams& p, Stream st) override { cpu_.kv_spill(p, st); }
  void kv_write(const KvWriteParams& p, Stream st) override { cpu_.kv_write(p, st); }
  void gather_rows(const GatherRowsParams& p, Stream st) override { cpu_.gather_rows(p, st); }
  void embedding(const EmbeddingParams& p, Stream st) override { cpu_.embedding(p, st); }  // bf16 values already

  void rms_norm(const RmsNormParams& p, Stream st) override {
    const int64_t width = p.num_heads * p.dim;
    RmsNormParams plain = p;
    if (p.residual != nullptr) {
      const int64_t x_stride = p.x_token_stride ? p.x_token_stride : width;
      const int64_t r_stride = p.residual_token_stride ? p.residual_token_stride : width;
      auto* r = static_cast<float*>(p.residual);
      const auto* x = static_cast<const float*>(p.x);
      for (int64_t t = 0; t < p.num_tokens; ++t)
        for (int64_t i = 0; i < width; ++i) r[t * r_stride + i] = round(r[t * r_stride + i] + x[t * x_stride + i]);
      plain.x = p.residual;
      plain.x_token_stride = r_stride;
      plain.residual = nullptr;
    }
    cpu_.rms_norm(plain, st);
    round_rows(p.out, p.num_tokens, width, p.out_token_stride ? p.out_token_stride : width);
  }
  void linear(const LinearParams& p, Stream st) override {
    if (p.weight_dtype == WeightDtype::fp8_e4m3 && p.num_tokens > cuda::kFp8GemvMaxTokens &&
        cuda::CublasLtLinear::device_has_fp8_gemm() && cuda::CublasLtLinear::fp8_gemm_supported(p)) {
      const int64_t k = p.in_features, x_stride = p.x_stride ? p.x_stride : k;
      const int64_t block = p.weight_block_k > 0 && p.weight_block_k < k ? 128 : k;
      std::vector<float> xq(static_cast<std::size_t>(p.num_tokens * k));
      std::vector<std::uint8_t> codes(static_cast<std::size_t>(block));
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        for (int64_t k0 = 0; k0 < k; k0 += block) {
          const int64_t n = std::min(block, k - k0);
          float scale = 0.0f;
          quantize_row_fp8(static_cast<const float*>(p.x) + t * x_stride + k0, n, codes.data(), &scale);
          for (int64_t i = 0; i < n; ++i)
            xq[static_cast<std::size_t>(t * k + k0 + i)] = fp8_e4m3_decode(codes[static_cast<std::size_t>(i)]) * scale;
        }
      }
      LinearParams q = p;
      q.x = xq.data();
      q.x_stride = k;
      cpu_.linear(q, st);
    } else {
      cpu_.linear(p, st);
    }
    if (!p.y_fp32) round_rows(p.y, p.num_tokens, p.out_features, p.y_stride ? p.y_stride : p.out_features);
  }
  void rope(const RopeParams& p, Stream st) override {
    RopeParams plain = p;  // a fused rotation as the device computes it: RoPE rounded, then the transform
    plain.rotate_heads = 0;
    cpu_.rope(plain, st);
    const int64_t qw = p.num_q_heads * p.head_dim, kw = p.num_kv_heads * p.head_dim;
    if (p.q) round_rows(p.q, p.num_tokens, qw, p.q_token_stride ? p.q_token_stride : qw);
    if (p.k) round_rows(p.k, p.num_tokens, kw, p.k_token_stride ? p.k_token_stride : kw);
    if (p.rotate_heads) head_hadamard(rope_rotation(p, sizeof(float)), st);
  }
  void head_hadamard(const HeadHadamardParams& p, Stream st) override {
    cpu_.head_hadamard(p, st);
    const int64_t w = p.num_heads * p.head_dim;
    round_rows(p.x, p.num_tokens, w, p.token_stride ? p.token_stride : w);
  }
  void paged_attention(const PagedAttentionParams& p, Stream st) override {
    cpu_.paged_attention(p, st);
    const int64_t w = static_cast<int64_t>(p.num_heads) * p.cache.head_dim;
    round_rows(p.out, p.batch.num_tokens, w, p.out_token_stride ? p.out_token_stride : w);
  }
  void silu_mul(const SiluMulParams& p, Stream st) override {
    cpu_.silu_mul(p, st);
    round_rows(p.out, p.num_tokens, p.dim, p.out_token_stride ? p.out_token_stride : p.dim);
  }
  void residual_add(const ResidualAddParams& p, Stream st) override {
    cpu_.residual_add(p, st);
    round_rows(p.residual, 1, p.num_elements, p.num_elements);
  }

 private:
  static float round(float v) { return bf16_decode(bf16_encode(v)); }
  static void round_rows(void* base, int64_t rows, int64_t width, int64_t stride) {
    auto* f = static_cast<float*>(base);
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < width; ++i) f[t * stride + i] = round(f[t * stride + i]);
  }

  cpu::ThreadPool pool_;
  cpu::CpuBackend cpu_;
};

}  // namespace fp8serve::gpu_test
