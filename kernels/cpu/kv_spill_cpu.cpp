#include "kernels/cpu/kv_spill_cpu.hpp"

#include <algorithm>
#include <cfloat>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention_item.hpp"
#include "kernels/cpu/kv_store.hpp"
#include "kernels/cpu/paged_kv_check.hpp"

namespace fp8serve::cpu {

namespace {

constexpr int32_t kPositionsPerItem = 16;

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("kv_spill: " + what); }

// Sequence s's spill range [begin, end) (kernels/kv_spill.hpp).
struct Range {
  int32_t begin = 0, end = 0;
};
Range spill_range(const KvSpillParams& p, int32_t s) {
  const PagedBatch& b = p.batch;
  const int32_t context_before = b.context_lens[s] - b.num_new_tokens(s);
  return {p.spill_starts[s], std::min(b.fp8_lens[s], context_before)};
}

}  // namespace

void validate_kv_spill(const KvSpillParams& params) {
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  validate_paged_kv_view(cache);
  validate_query_starts(batch);
  if (!batch.has_tail()) fail("needs the bf16 window's fields (batch.fp8_lens)");
  validate_tail(batch, cache, params.tail);
  if (batch.num_seqs > 0 && (params.spill_starts == nullptr || batch.block_tables == nullptr ||
                             batch.k_scales == nullptr || batch.v_scales == nullptr)) {
    fail("null spill_starts, block_tables or scales");
  }
  const int64_t ring_tokens = static_cast<int64_t>(batch.tail_ring_blocks) * cache.block_size;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const Range r = spill_range(params, s);
    if (r.end <= r.begin) continue;
    const std::string name = "sequence " + std::to_string(s);
    const int32_t context_before = batch.context_lens[s] - batch.num_new_tokens(s);
    if (r.begin < 0 || context_before - r.begin > ring_tokens) {
      fail(name + " spills from position " + std::to_string(r.begin) + ", which its ring no longer holds");
    }
    if (r.end - r.begin > params.max_spill_tokens) {
      fail(name + " spills " + std::to_string(r.end - r.begin) + " positions, max_spill_tokens is " +
           std::to_string(params.max_spill_tokens));
    }
    const int32_t last_block = (r.end - 1) / cache.block_size;
    if (last_block >= batch.max_blocks_per_seq) fail(name + " spills past its block table");
    for (int32_t b = r.begin / cache.block_size; b <= last_block; ++b) {
      const int32_t id = batch.block_table(s)[b];
      if (id < 0 || id >= cache.num_blocks) fail(name + " block " + std::to_string(b) + " has id " + std::to_string(id));
    }
    const float k = batch.k_scales[s], v = batch.v_scales[s];
    if (!(k > 0.0f && k <= FLT_MAX && v > 0.0f && v <= FLT_MAX)) fail(name + " has a scale that is not finite and > 0");
  }
}

void kv_spill_cpu(const KvSpillParams& params, ThreadPool& pool) {
  validate_kv_spill(params);
  const PagedKvView& cache = params.cache;
  const PagedKvView& tail = params.tail;
  const PagedBatch& batch = params.batch;
  // Items of up to kPositionsPerItem positions of one sequence, in sequence order.
  struct Item {
    int32_t seq, begin, end;
  };
  std::vector<Item> items;
  for (int32_t s = 0; s < batch.num_seqs && params.max_spill_tokens > 0; ++s) {
    const Range r = spill_range(params, s);
    for (int32_t p = r.begin; p < r.end; p += kPositionsPerItem) items.push_back({s, p, std::min(r.end, p + kPositionsPerItem)});
  }
  if (items.empty()) return;
  const int32_t head_dim = cache.head_dim;
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * head_dim;
  const int64_t k_group_stride = static_cast<int64_t>(cache.block_size) * kv_k_pack(cache.dtype);
  const int64_t tail_k_group_stride = static_cast<int64_t>(cache.block_size) * kv_k_pack(KvDtype::bf16);
  std::vector<KvWriteCounts> item_counts(items.size());
  pool.parallel_for(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& it = items[static_cast<std::size_t>(i)];
    KvWriteCounts& counts = item_counts[static_cast<std::size_t>(i)];
    const float k_scale = batch.k_scales[it.seq], v_scale = batch.v_scales[it.seq];
    float values[kMaxHeadDim];
    for (int32_t p = it.begin; p < it.end; ++p) {
      const int64_t from = batch.tail_slot(it.seq, p, cache.block_size);
      const int64_t to = static_cast<int64_t>(batch.block_table(it.seq)[p / cache.block_size]) * cache.block_size +
                         p % cache.block_size;
      for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
        load_bf16_row(tail.k, tail.k_offset(from, h, 0), head_dim, kv_k_pack(KvDtype::bf16), tail_k_group_stride, values);
        counts.num_k_saturated += store_row(values, cache.k, cache.k_offset(to, h, 0), head_dim, kv_k_pack(cache.dtype),
                                            k_group_stride, RowCodec::fp8_via_bf16, k_scale);
        if (tail.v == nullptr) continue;  // K-only window: V went to the pool when written
        load_bf16_row(tail.v, tail.v_offset(from, h), head_dim, head_dim, 0, values);
        counts.num_v_saturated += store_row(values, cache.v, cache.v_offset(to, h), head_dim, head_dim, 0,
                                            RowCodec::fp8_via_bf16, v_scale);
      }
      counts.num_elements += static_cast<uint64_t>(row);
      if (tail.v != nullptr) counts.num_v_elements += static_cast<uint64_t>(row);
    }
  });
  if (params.counts != nullptr) {
    for (const KvWriteCounts& c : item_counts) *params.counts += c;
  }
}

}  // namespace fp8serve::cpu
