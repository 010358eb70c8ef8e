#pragma once
// A Backend that forwards every op to another one and adds up the time each kind of op takes:
// where a decode step's time goes (bench_engine --profile). The CPU backend's ops have finished
// when they return, so wall time around each call is the op's time. Projections are told apart
// by their shape (qkv, o, gate_up, down, LM head).
#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "kernels/backend.hpp"

namespace fp8serve::bench {

class TimingBackend final : public Backend {
 public:
  explicit TimingBackend(Backend& inner) : inner_(inner) {}

  // Op name -> {seconds, calls}. Projections are "linear <out>x<in>".
  struct Total {
    double seconds = 0;
    long calls = 0;
  };
  const std::map<std::string, Total>& totals() const { return totals_; }
  void reset() { totals_.clear(); }

  std::string_view name() const override { return inner_.name(); }
  ActDtype activation_dtype() const override { return inner_.activation_dtype(); }
  std::string describe() const override { return inner_.describe(); }
  bool supports_weight_dtype(WeightDtype d) const override { return inner_.supports_weight_dtype(d); }
  void* allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
  void free(void* ptr) override { inner_.free(ptr); }
  std::optional<DeviceMemory> memory_info() const override { return inner_.memory_info(); }
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream s) override {
    time("copy", [&] { inner_.copy_to_device(dst, src, bytes, s); });
  }
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s) override {
    time("copy", [&] { inner_.copy_to_host(dst, src, bytes, s); });
  }
  void synchronize(Stream s) override { inner_.synchronize(s); }
  void copy_blocks(const CopyBlocksParams& p, Stream s) override { time("copy_blocks", [&] { inner_.copy_blocks(p, s); }); }
  void set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) override {
    inner_.set_rope_table(inv_freq, max_positions);
  }
  void embedding(const EmbeddingParams& p, Stream s) override { time("embedding", [&] { inner_.embedding(p, s); }); }
  void rms_norm(const RmsNormParams& p, Stream s) override { time("rms_norm", [&] { inner_.rms_norm(p, s); }); }
  void linear(const LinearParams& p, Stream s) override {
    time("linear " + std::to_string(p.out_features) + "x" + std::to_string(p.in_features), [&] { inner_.linear(p, s); });
  }
  void rope(const RopeParams& p, Stream s) override { time("rope", [&] { inner_.rope(p, s); }); }
  void head_hadamard(const HeadHadamardParams& p, Stream s) override {
    time("head_hadamard", [&] { inner_.head_hadamard(p, s); });
  }
  void kv_spill(const KvSpillParams& p, Stream s) override { time("kv_spill", [&] { inner_.kv_spill(p, s); }); }
  void kv_write(const KvWriteParams& p, Stream s) override { time("kv_write", [&] { inner_.kv_write(p, s); }); }
  void paged_attention(const PagedAttentionParams& p, Stream s) override {
    time("attention", [&] { inner_.paged_attention(p, s); });
  }
  void silu_mul(const SiluMulParams& p, Stream s) override { time("silu_mul", [&] { inner_.silu_mul(p, s); }); }
  void residual_add(const ResidualAddParams& p, Stream s) override {
    time("residual_add", [&] { inner_.residual_add(p, s); });
  }
  void gather_rows(const GatherRowsParams& p, Stream s) override { time("gather_rows", [&] { inner_.gather_rows(p, s); }); }

 private:
  template <typename Fn>
  void time(const std::string& op, const Fn& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    Total& t = totals_[op];
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t.calls;
  }

  Backend& inner_;
  std::map<std::string, Total> totals_;
};

}  // namespace fp8serve::bench
