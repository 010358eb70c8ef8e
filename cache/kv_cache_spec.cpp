#include "cache/kv_cache_spec.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace fp8serve {

namespace {

// Generous upper bounds that keep every product below in uint64 and reject nonsense configs.
constexpr int kMaxBlockSize = 1 << 12;
constexpr int kMaxLayers = 1 << 10;
constexpr int kMaxKvHeads = 1 << 10;
constexpr int kMaxHeadDim = 1 << 12;

void check_range(const char* name, int value, int max) {
  if (value <= 0 || value > max) {
    throw std::invalid_argument(std::string("KV cache ") + name + " must be in [1, " + std::to_string(max) +
                                "], got " + std::to_string(value));
  }
}

}  // namespace

void KvCacheSpec::validate() const {
  check_range("block_size", block_size, kMaxBlockSize);
  check_range("num_layers", num_layers, kMaxLayers);
  check_range("num_kv_heads", num_kv_heads, kMaxKvHeads);
  check_range("head_dim", head_dim, kMaxHeadDim);
  if (kv_dtype_size(dtype) == 0) throw std::invalid_argument("KV cache dtype is not a known KvDtype");
  window.validate();
  if (window.enabled() && window.block_size != block_size) {
    throw std::invalid_argument("KV cache window.block_size must equal block_size");
  }
  if (window.enabled() && dtype != KvDtype::fp8_e4m3) {
    throw std::invalid_argument("--kv-bf16-window needs --kv-cache-dtype fp8_e4m3 (a bf16 pool is exact already)");
  }
}

uint64_t KvCacheSpec::bytes_per_token() const {
  return static_cast<uint64_t>(num_layers) * 2u * static_cast<uint64_t>(num_kv_heads) *
         static_cast<uint64_t>(head_dim) * kv_dtype_size(dtype);
}

int KvCacheSpec::num_blocks_for_budget(uint64_t budget_bytes) const {
  const uint64_t per_block = bytes_per_block();
  if (per_block == 0) throw std::invalid_argument("KvCacheSpec::num_blocks_for_budget: spec not validated");
  const uint64_t max_blocks = static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) / block_size;
  return static_cast<int>(std::min(budget_bytes / per_block, max_blocks));
}

KvCacheSpec::BudgetSplit KvCacheSpec::split_budget(uint64_t budget_bytes, int max_rings, double max_tail_share) const {
  BudgetSplit split;
  if (window.enabled()) {
    const auto share = static_cast<uint64_t>(static_cast<double>(budget_bytes) * max_tail_share);
    split.num_rings = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(std::max(max_rings, 0)), share / tail_bytes(1)));
    if (split.num_rings > 0) split.window = window;
  }
  const uint64_t tail = tail_bytes(split.num_rings);
  split.num_blocks = budget_bytes > tail ? num_blocks_for_budget(budget_bytes - tail) : 0;
  return split;
}

std::string KvCacheSpec::describe(int num_blocks) const {
  const double mib = static_cast<double>(bytes_per_block()) * num_blocks / (1024.0 * 1024.0);
  char text[160];
  std::snprintf(text, sizeof text, "%d blocks x %d tokens = %lld tokens, %.1f MiB, %s", num_blocks, block_size,
                static_cast<long long>(num_blocks) * block_size, mib, std::string(kv_dtype_name(dtype)).c_str());
  return text;
}

uint64_t KvCacheSpec::tail_bytes_per_token() const {
  if (!window.enabled()) return 0;
  return static_cast<uint64_t>(num_layers) * (window.values ? 2u : 1u) * static_cast<uint64_t>(num_kv_heads) *
         static_cast<uint64_t>(head_dim) * kv_dtype_size(KvDtype::bf16);
}

uint64_t KvCacheSpec::tail_bytes(int num_rings) const {
  return tail_bytes_per_token() * static_cast<uint64_t>(window.ring_blocks()) * static_cast<uint64_t>(block_size) *
         static_cast<uint64_t>(std::max(num_rings, 0));
}

std::string KvCacheSpec::describe_tail(int num_rings) const {
  if (!window.enabled()) return "bf16 window off";
  char text[160];
  std::snprintf(text, sizeof text, "bf16 window %d tokens (%s): %d rings x %d blocks, %.1f MiB, %llu bytes/token",
                window.tokens, window.values ? "K+V" : "K only", num_rings, window.ring_blocks(),
                static_cast<double>(tail_bytes(num_rings)) / (1024.0 * 1024.0),
                static_cast<unsigned long long>(tail_bytes_per_token()));
  return text;
}

}  // namespace fp8serve
