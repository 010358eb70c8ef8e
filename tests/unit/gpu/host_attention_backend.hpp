#pragma once
// A test-only Backend: every op on the CUDA backend, except paged attention, which runs on the
// host (the CPU backend's op on downloaded copies of q, the pool and the batch arrays) and is
// uploaded back as bf16. It lets the end-to-end test run the whole CUDA forward pass - every
// kernel of this branch - before (or without) the CUDA attention of branch cudaattn.
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/bf16.hpp"
#include "kernels/cpu/cpu_backend.hpp"

namespace fp8serve::gpu_test {

class HostAttentionBackend final : public Backend {
 public:
  explicit HostAttentionBackend(std::unique_ptr<Backend> device) : device_(std::move(device)), pool_(2), cpu_(pool_) {}

  std::string_view name() const override { return device_->name(); }
  ActDtype activation_dtype() const override { return device_->activation_dtype(); }
  std::string describe() const override { return device_->describe() + " + host attention"; }
  bool supports_weight_dtype(WeightDtype d) const override { return device_->supports_weight_dtype(d); }
  void* allocate(std::size_t bytes) override { return device_->allocate(bytes); }
  void free(void* ptr) override { device_->free(ptr); }
  void copy_to_device(void* d, const void* s, std::size_t n, Stream st) override { device_->copy_to_device(d, s, n, st); }
  void copy_to_host(void* d, const void* s, std::size_t n, Stream st) override { device_->copy_to_host(d, s, n, st); }
  void synchronize(Stream st) override { device_->synchronize(st); }
  std::optional<DeviceMemory> memory_info() const override { return device_->memory_info(); }
  void copy_blocks(const CopyBlocksParams& p, Stream st) override { device_->copy_blocks(p, st); }
  void set_rope_table(const std::vector<float>& f, int64_t n) override { device_->set_rope_table(f, n); }
  void embedding(const EmbeddingParams& p, Stream st) override { device_->embedding(p, st); }
  void rms_norm(const RmsNormParams& p, Stream st) override { device_->rms_norm(p, st); }
  void linear(const LinearParams& p, Stream st) override { device_->linear(p, st); }
  void rope(const RopeParams& p, Stream st) override { device_->rope(p, st); }
  void head_hadamard(const HeadHadamardParams& p, Stream st) override { device_->head_hadamard(p, st); }
  void kv_spill(const KvSpillParams& p, Stream st) override { device_->kv_spill(p, st); }
  void kv_write(const KvWriteParams& p, Stream st) override { device_->kv_write(p, st); }
  void silu_mul(const SiluMulParams& p, Stream st) override { device_->silu_mul(p, st); }
  void residual_add(const ResidualAddParams& p, Stream st) override { device_->residual_add(p, st); }
  void gather_rows(const GatherRowsParams& p, Stream st) override { device_->gather_rows(p, st); }

  void paged_attention(const PagedAttentionParams& p, Stream st) override {
    const PagedBatch& b = p.batch;
    const int64_t hd = p.cache.head_dim;
    const int64_t width = static_cast<int64_t>(p.num_heads) * hd;
    const int64_t q_stride = p.q_token_stride ? p.q_token_stride : width;
    const int64_t out_stride = p.out_token_stride ? p.out_token_stride : width;
    const std::size_t elem = kv_dtype_size(p.cache.dtype);
    const std::size_t pool_bytes = static_cast<std::size_t>(p.cache.num_blocks) * p.cache.block_stride * elem;
    // Download what the op reads.
    std::vector<std::uint16_t> q(static_cast<std::size_t>(b.num_tokens * q_stride));
    std::vector<std::uint8_t> k(pool_bytes), v(pool_bytes);
    std::vector<int32_t> qsl(static_cast<std::size_t>(b.num_seqs + 1)), ctx(static_cast<std::size_t>(b.num_seqs));
    std::vector<int32_t> tables(static_cast<std::size_t>(b.num_seqs) * b.max_blocks_per_seq);
    std::vector<float> ks(static_cast<std::size_t>(b.num_seqs)), vs(ks.size());
    get(q, p.q, st);
    get(k, p.cache.k, st);
    get(v, p.cache.v, st);
    get(qsl, b.query_start_loc, st);
    get(ctx, b.context_lens, st);
    get(tables, b.block_tables, st);
    if (b.k_scales) get(ks, b.k_scales, st);
    if (b.v_scales) get(vs, b.v_scales, st);
    device_->synchronize(st);

    std::vector<float> qf(static_cast<std::size_t>(b.num_tokens * width)), out(qf.size());
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      for (int64_t i = 0; i < width; ++i) qf[static_cast<std::size_t>(t * width + i)] = bf16_decode(q[static_cast<std::size_t>(t * q_stride + i)]);
    }
    PagedAttentionParams h = p;
    h.q = qf.data();
    h.out = out.data();
    h.q_token_stride = h.out_token_stride = width;
    h.cache.k = k.data();
    h.cache.v = v.data();
    h.batch.query_start_loc = qsl.data();
    h.batch.context_lens = ctx.data();
    h.batch.block_tables = tables.data();
    h.batch.k_scales = ks.data();
    h.batch.v_scales = vs.data();
    h.batch.slot_mapping = nullptr;
    h.batch.calibrate = nullptr;
    cpu_.paged_attention(h, Stream{});

    // Upload the rows in bf16 into their strided places (the rest of each row is left alone).
    std::vector<std::uint16_t> rows(static_cast<std::size_t>(b.num_tokens * out_stride));
    get(rows, p.out, st);
    device_->synchronize(st);
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      for (int64_t i = 0; i < width; ++i) rows[static_cast<std::size_t>(t * out_stride + i)] = bf16_encode(out[static_cast<std::size_t>(t * width + i)]);
    }
    device_->copy_to_device(p.out, rows.data(), rows.size() * sizeof(std::uint16_t), st);
  }

 private:
  template <typename T>
  void get(std::vector<T>& host, const void* device, Stream st) {
    device_->copy_to_host(host.data(), device, host.size() * sizeof(T), st);
  }

  std::unique_ptr<Backend> device_;
  cpu::ThreadPool pool_;
  cpu::CpuBackend cpu_;
};

}  // namespace fp8serve::gpu_test
