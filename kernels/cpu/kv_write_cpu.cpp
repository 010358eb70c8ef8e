#include "kernels/cpu/kv_write_cpu.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kv_store.hpp"
#include "kernels/cpu/paged_kv_check.hpp"

namespace fp8serve::cpu {

namespace {

constexpr int32_t kTokensPerItem = 16;

bool calibrates(const PagedBatch& batch, int32_t seq) {
  return batch.calibrate != nullptr && batch.calibrate[seq] != 0;
}

// max |x| over the sequence's new tokens, all heads. NaN is skipped (a comparison with NaN is
// false); an infinity yields an infinite amax, which calibrate_kv_scale maps to FLT_MAX.
float chunk_amax(const float* x, int64_t token_stride, int32_t first, int32_t count, int32_t row) {
  float amax = 0.0f;
  for (int32_t t = first; t < first + count; ++t) {
    const float* src = x + t * token_stride;
    for (int32_t i = 0; i < row; ++i) {
      const float a = std::fabs(src[i]);
      if (a > amax) amax = a;
    }
  }
  return amax;
}

}  // namespace

void validate_kv_write(const KvWriteParams& params) {
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  validate_paged_kv_view(cache);
  validate_query_starts(batch);
  validate_tail(batch, cache, params.tail);
  if (batch.num_tokens == 0) return;
  const int64_t row = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  auto bad_stride = [row](int64_t stride) { return stride != 0 && stride < row; };
  if (params.k == nullptr || params.v == nullptr || bad_stride(params.k_token_stride) ||
      bad_stride(params.v_token_stride)) {
    throw std::invalid_argument("kv_write: null k/v or token stride (not 0) < num_kv_heads * head_dim");
  }
  if (batch.slot_mapping == nullptr) throw std::invalid_argument("kv_write: null slot_mapping");
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (int32_t t = 0; t < batch.num_tokens; ++t) {
    if (batch.slot_mapping[t] >= num_slots) {
      throw std::invalid_argument("kv_write: token " + std::to_string(t) + " has slot " +
                                  std::to_string(batch.slot_mapping[t]) + ", pool has " +
                                  std::to_string(num_slots));
    }
  }
  if (cache.dtype != KvDtype::fp8_e4m3) return;
  if (batch.k_scales == nullptr || batch.v_scales == nullptr) {
    throw std::invalid_argument("kv_write: FP8 pool needs k_scales and v_scales");
  }
  bool any_calibrates = false;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    if (calibrates(batch, s)) {
      any_calibrates = true;
      continue;
    }
    const float k = batch.k_scales[s];
    const float v = batch.v_scales[s];
    if (!(k > 0.0f && k <= FLT_MAX && v > 0.0f && v <= FLT_MAX)) {
      throw std::invalid_argument("kv_write: sequence " + std::to_string(s) +
                                  " has a frozen scale that is not finite and > 0");
    }
  }
  if (any_calibrates) validate_kv_scale_margin(params.scale_margin);
}

void kv_write_cpu(const KvWriteParams& given, ThreadPool& pool) {
  validate_kv_write(given);
  KvWriteParams params = given;
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  const int32_t row = cache.num_kv_heads * cache.head_dim;
  if (params.k_token_stride == 0) params.k_token_stride = row;
  if (params.v_token_stride == 0) params.v_token_stride = row;
  const float* k = static_cast<const float*>(params.k);
  const float* v = static_cast<const float*>(params.v);
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  const int32_t k_pack = kv_k_pack(cache.dtype);
  const int64_t k_group_stride = static_cast<int64_t>(cache.block_size) * k_pack;

  if (fp8 && batch.calibrate != nullptr) {
    // Calibrate before any token is quantized: every token of the chunk uses the new scale.
    pool.parallel_for(batch.num_seqs, [&](int64_t i) {
      const int32_t s = static_cast<int32_t>(i);
      if (!calibrates(batch, s)) return;
      const int32_t first = batch.query_start_loc[s];
      const int32_t count = batch.num_new_tokens(s);
      batch.k_scales[s] = calibrate_kv_scale(chunk_amax(k, params.k_token_stride, first, count, row), params.scale_margin);
      batch.v_scales[s] = calibrate_kv_scale(chunk_amax(v, params.v_token_stride, first, count, row), params.scale_margin);
    });
  }

  // Where token t's rows go: its FP8 slot, or (window) the tail for positions >= fp8_lens.
  const bool window = batch.has_tail();
  const PagedKvView& tail = params.tail;
  const RowCodec fp8_codec = !fp8 ? RowCodec::bf16 : window ? RowCodec::fp8_via_bf16 : RowCodec::fp8;
  const int64_t tail_k_group_stride = static_cast<int64_t>(cache.block_size) * kv_k_pack(KvDtype::bf16);

  const int64_t num_items = (batch.num_tokens + kTokensPerItem - 1) / kTokensPerItem;
  std::vector<KvWriteCounts> item_counts(static_cast<std::size_t>(num_items));
  pool.parallel_for(num_items, [&](int64_t item) {
    const int32_t begin = static_cast<int32_t>(item) * kTokensPerItem;
    const int32_t end = std::min(batch.num_tokens, begin + kTokensPerItem);
    // The sequence owning token `begin`: the last s with query_start_loc[s] <= begin.
    int32_t seq = static_cast<int32_t>(
        std::upper_bound(batch.query_start_loc, batch.query_start_loc + batch.num_seqs + 1, begin) -
        batch.query_start_loc) - 1;
    KvWriteCounts& counts = item_counts[static_cast<std::size_t>(item)];
    for (int32_t t = begin; t < end; ++t) {
      while (batch.query_start_loc[seq + 1] <= t) ++seq;
      const int64_t slot = batch.slot_mapping[t];
      if (slot < 0) continue;  // padding token: no cache slot
      const float k_scale = fp8 ? batch.k_scales[seq] : 1.0f;
      const float v_scale = fp8 ? batch.v_scales[seq] : 1.0f;
      bool k_to_tail = false, v_to_tail = false;
      int64_t tail_slot = -1;
      if (window) {
        const int32_t pos = batch.context_lens[seq] - batch.num_new_tokens(seq) + (t - batch.query_start_loc[seq]);
        k_to_tail = pos >= batch.fp8_lens[seq];
        v_to_tail = k_to_tail && tail.v != nullptr;
        if (k_to_tail) tail_slot = batch.tail_slot(seq, pos, cache.block_size);
      }
      for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
        const int64_t src = static_cast<int64_t>(h) * cache.head_dim;
        const float* k_row = k + t * params.k_token_stride + src;
        const float* v_row = v + t * params.v_token_stride + src;
        if (k_to_tail) {
          store_row(k_row, tail.k, tail.k_offset(tail_slot, h, 0), cache.head_dim, kv_k_pack(KvDtype::bf16),
                    tail_k_group_stride, RowCodec::bf16, 1.0f);
        } else {
          counts.num_k_saturated += store_row(k_row, cache.k, cache.k_offset(slot, h, 0), cache.head_dim, k_pack,
                                              k_group_stride, fp8_codec, k_scale);
        }
        if (v_to_tail) {
          store_row(v_row, tail.v, tail.v_offset(tail_slot, h), cache.head_dim, cache.head_dim, 0, RowCodec::bf16, 1.0f);
        } else {
          counts.num_v_saturated += store_row(v_row, cache.v, cache.v_offset(slot, h), cache.head_dim, cache.head_dim,
                                              0, fp8_codec, v_scale);
        }
      }
      if (!k_to_tail) counts.num_elements += static_cast<uint64_t>(row);
      if (!v_to_tail) counts.num_v_elements += static_cast<uint64_t>(row);
    }
  });
  if (params.counts != nullptr) {
    for (const KvWriteCounts& c : item_counts) *params.counts += c;
  }
}

}  // namespace fp8serve::cpu
