#include "kernels/cpu/paged_attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/paged_kv_check.hpp"

namespace fp8serve::cpu {

namespace {

using ItemFn = void (*)(const AttentionItem&);

ItemFn item_function(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512bf16: return attend_item_avx512bf16;
    case CpuIsa::avx512: return attend_item_avx512;
    case CpuIsa::avx2: return attend_item_avx2;
    default: return attend_item_scalar;
  }
}

int32_t partition_tokens(int32_t block_size) {
  return std::max(block_size, (kPartitionTokens + block_size - 1) / block_size * block_size);
}

// Merges one (sequence, KV head)'s partitions in partition order:
// out = v_scale * sum_p 2^(m_p - M) o_p / sum_p 2^(m_p - M) l_p with M = max_p m_p. With a
// bf16 V tail the partitions that reach it hold their values' own units already: then
// out = sum_p 2^(m_p - M) f_p o_p / sum_p 2^(m_p - M) l_p with f_p = v_scale for the others, 1
// for them (attention_item.hpp).
void merge_partials(const PagedAttentionParams& params, const AttentionWorkspace::Merge& merge,
                    const float* partials) {
  const int32_t head_dim = params.cache.head_dim;
  const int32_t group = params.num_heads / params.cache.num_kv_heads;
  const int64_t o_size = static_cast<int64_t>(merge.num_parts) * merge.rows * head_dim;
  const float* o = partials + merge.scratch;                 // [parts, rows, head_dim]
  const float* m = o + o_size;                               // [parts, rows]
  const float* l = m + static_cast<int64_t>(merge.num_parts) * merge.rows;  // [parts, rows]
  const float v_scale = params.cache.dtype == KvDtype::fp8_e4m3 ? params.batch.v_scales[merge.seq] : 1.0f;
  // Partition p reaches a bf16 V tail when its keys do, as the item decides (attend_rows).
  const bool mixed = params.batch.has_tail() && params.tail.v != nullptr;
  const int32_t part_tokens = partition_tokens(params.cache.block_size);
  auto exact = [&](int32_t p) {
    return std::min(merge.context_len, (p + 1) * part_tokens) > params.batch.fp8_lens[merge.seq];
  };
  const int32_t first_token = merge.first_token;
  float* out = static_cast<float*>(params.out);
  float acc[kMaxHeadDim];
  for (int32_t row = 0; row < merge.rows; ++row) {
    float m_max = -std::numeric_limits<float>::infinity();
    for (int32_t p = 0; p < merge.num_parts; ++p) m_max = std::max(m_max, m[p * merge.rows + row]);
    std::fill(acc, acc + head_dim, 0.0f);
    float sum = 0.0f;
    for (int32_t p = 0; p < merge.num_parts; ++p) {
      const float lp = l[p * merge.rows + row];
      if (lp == 0.0f) continue;  // the partition lies wholly after this row's position
      const float w = std::exp2(m[p * merge.rows + row] - m_max);
      sum += lp * w;
      // Mixed units (a tail): each partition's own factor; otherwise v_scale once, below.
      const float wo = mixed ? w * (exact(p) ? 1.0f : v_scale) : w;
      const float* op = o + (static_cast<int64_t>(p) * merge.rows + row) * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) acc[d] += op[d] * wo;
    }
    const int32_t token = first_token + row / group;
    const int32_t head = merge.kv_head * group + row % group;
    float* dst = out + token * params.out_token_stride + static_cast<int64_t>(head) * head_dim;
    const float mul = (mixed ? 1.0f : v_scale) / sum;
    for (int32_t d = 0; d < head_dim; ++d) dst[d] = acc[d] * mul;
  }
}

// Cuts the batch into work items (see the header) and lays out the partial buffers. Items are
// listed with the KV head innermost: a block holds every head's rows side by side, so the
// threads working at one time read neighbouring parts of the same blocks and what the hardware
// prefetcher fetches past one head's rows is the next item's. The order changes no result.
void plan_work(const PagedAttentionParams& params, AttentionWorkspace& ws) {
  const PagedKvView& cache = params.cache;
  const PagedBatch& batch = params.batch;
  const int32_t group = params.num_heads / cache.num_kv_heads;
  const int32_t part_tokens = partition_tokens(cache.block_size);
  const bool fp8 = cache.dtype == KvDtype::fp8_e4m3;
  const float* q = static_cast<const float*>(params.q);
  float* out = static_cast<float*>(params.out);
  ws.work.clear();
  ws.merges.clear();
  int64_t scratch = 0;
  // One span of a sequence's new tokens: all of them, or (a short chunk) one token at a time.
  auto plan_span = [&](int32_t s, int32_t first_token, int32_t num_new, int32_t context_len) {
    const int32_t first_pos = context_len - num_new;
    const bool split = num_new <= kQueryTile;
    const int32_t num_tiles = split ? 1 : (num_new + kQueryTile - 1) / kQueryTile;
    const int32_t num_parts = split ? (context_len + part_tokens - 1) / part_tokens : 1;
    auto head_item = [&](int32_t h) {
      AttentionItem item;
      item.dtype = cache.dtype;
      item.q_token_stride = params.q_token_stride;
      item.group = group;
      item.block_table = batch.block_table(s);
      const int64_t head_bytes = h * cache.head_stride * static_cast<int64_t>(kv_dtype_size(cache.dtype));
      item.k = static_cast<const char*>(cache.k) + head_bytes;
      item.v = static_cast<const char*>(cache.v) + head_bytes;
      item.block_stride = cache.block_stride;
      item.v_token_stride = cache.v_token_stride;
      item.block_size = cache.block_size;
      item.head_dim = cache.head_dim;
      item.qk_scale = params.softmax_scale * (fp8 ? batch.k_scales[s] : 1.0f);
      item.v_scale = fp8 ? batch.v_scales[s] : 1.0f;
      if (batch.has_tail()) {
        const PagedKvView& tail = params.tail;
        const int64_t tail_head_bytes = h * tail.head_stride * static_cast<int64_t>(kv_dtype_size(KvDtype::bf16));
        item.tail_k = static_cast<const char*>(tail.k) + tail_head_bytes;
        item.tail_v = tail.v != nullptr ? static_cast<const char*>(tail.v) + tail_head_bytes : nullptr;
        item.tail_begin = batch.fp8_lens[s];
        item.tail_first_block = batch.tail_slots[s] * batch.tail_ring_blocks;
        item.tail_ring_blocks = batch.tail_ring_blocks;
        item.tail_block_stride = tail.block_stride;
        item.tail_v_token_stride = tail.v_token_stride;
        item.tail_qk_scale = params.softmax_scale;
      }
      return item;
    };
    auto head_offset = [&](int32_t h) { return static_cast<int64_t>(h) * group * cache.head_dim; };
    if (num_parts == 1) {
      for (int32_t t = 0; t < num_tiles; ++t) {
        for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
          AttentionItem item = head_item(h);
          const int32_t tile_first = t * kQueryTile;
          item.num_q_tokens = std::min(kQueryTile, num_new - tile_first);
          item.q = q + (first_token + tile_first) * params.q_token_stride + head_offset(h);
          item.first_pos = first_pos + tile_first;
          item.key_begin = 0;
          item.key_end = context_len;
          item.out = out + (first_token + tile_first) * params.out_token_stride + head_offset(h);
          item.out_token_stride = params.out_token_stride;
          ws.work.push_back({item, s, h});
        }
      }
      return;
    }
    // Per head: o [parts, rows, head_dim], then m and l [parts, rows], from first_scratch.
    const int32_t rows = num_new * group;
    const int64_t o_size = static_cast<int64_t>(num_parts) * rows * cache.head_dim;
    const int64_t head_scratch = o_size + 2 * static_cast<int64_t>(num_parts) * rows;
    const int64_t first_scratch = scratch;
    for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
      ws.merges.push_back({first_scratch + h * head_scratch, num_parts, rows, s, h, first_token, context_len});
    }
    for (int32_t p = 0; p < num_parts; ++p) {
      for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
        AttentionItem item = head_item(h);
        item.num_q_tokens = num_new;
        item.q = q + first_token * params.q_token_stride + head_offset(h);
        item.first_pos = first_pos;
        item.key_begin = p * part_tokens;
        item.key_end = std::min(context_len, (p + 1) * part_tokens);
        // Offsets into `partials`; pointers are set once its final size is known.
        const int64_t at = first_scratch + h * head_scratch;
        AttentionWorkspace::Work w{item, s, h};
        w.out_offset = at + static_cast<int64_t>(p) * rows * cache.head_dim;
        w.m_offset = at + o_size + static_cast<int64_t>(p) * rows;
        w.l_offset = at + o_size + static_cast<int64_t>(num_parts + p) * rows;
        ws.work.push_back(w);
      }
    }
    scratch += cache.num_kv_heads * head_scratch;
  };
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const int32_t num_new = batch.num_new_tokens(s);
    if (num_new == 0) continue;
    const int32_t first_token = batch.query_start_loc[s];
    if (num_new > kQueryTile) {
      plan_span(s, first_token, num_new, batch.context_lens[s]);
      continue;
    }
    // A short chunk (a speculative verification, the end of a prompt) token by token, each as
    // its own decode step: same items, partitions, rows per pass and key chunks, so every row is
    // bitwise what a decode of that token gives (the rows per pass change the dot products'
    // accumulators, a longer key range the last key chunk).
    const int32_t first_pos = batch.context_lens[s] - num_new;
    for (int32_t t = 0; t < num_new; ++t) plan_span(s, first_token + t, 1, first_pos + t + 1);
  }
  ws.partials.resize(static_cast<std::size_t>(scratch));
  float* base = ws.partials.data();
  for (AttentionWorkspace::Work& w : ws.work) {
    if (w.out_offset < 0) continue;
    w.item.out = base + w.out_offset;
    w.item.m = base + w.m_offset;
    w.item.l = base + w.l_offset;
  }
}

}  // namespace

CpuIsa resolve_cpu_isa(CpuIsa isa, int32_t head_dim) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c && head_dim % 8 == 0;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && head_dim % 16 == 0;
  const bool avx512bf16 = avx512 && f.avx512vbmi && f.avx512bf16 && head_dim % 64 == 0;
  if ((isa == CpuIsa::best || isa == CpuIsa::avx512bf16) && avx512bf16) return CpuIsa::avx512bf16;
  if ((isa == CpuIsa::best || isa == CpuIsa::avx512 || isa == CpuIsa::avx512bf16) && avx512) return CpuIsa::avx512;
  if (isa != CpuIsa::scalar && avx2) return CpuIsa::avx2;
  return CpuIsa::scalar;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::best: return "best";
    case CpuIsa::avx512bf16: return "avx512bf16";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::scalar: return "scalar";
  }
  return "?";
}

CpuIsa parse_cpu_isa(const std::string& name) {
  for (CpuIsa isa : {CpuIsa::best, CpuIsa::avx512bf16, CpuIsa::avx512, CpuIsa::avx2, CpuIsa::scalar}) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  throw std::invalid_argument("unknown attention ISA '" + name + "' (best, avx512bf16, avx512, avx2, scalar)");
}

void validate_paged_attention(const PagedAttentionParams& params) {
  validate_paged_kv_view(params.cache);
  validate_query_starts(params.batch);
  validate_tail(params.batch, params.cache, params.tail);
  if (params.num_heads <= 0 || params.num_heads % params.cache.num_kv_heads != 0) {
    throw std::invalid_argument("paged attention: num_heads must be a positive multiple of num_kv_heads");
  }
  if (!std::isfinite(params.softmax_scale)) {
    throw std::invalid_argument("paged attention: softmax_scale must be finite");
  }
  const int64_t row = static_cast<int64_t>(params.num_heads) * params.cache.head_dim;
  auto bad_stride = [row](int64_t stride) { return stride != 0 && stride < row; };
  if (params.batch.num_tokens > 0 && (params.q == nullptr || params.out == nullptr ||
                                      bad_stride(params.q_token_stride) || bad_stride(params.out_token_stride))) {
    throw std::invalid_argument("paged attention: null q/out or token stride (not 0) < num_heads * head_dim");
  }
  validate_block_tables(params.batch, params.cache);
  validate_scales(params.batch, params.cache);
}

void paged_attention_cpu(const PagedAttentionParams& given, ThreadPool& pool,
                         AttentionWorkspace& workspace, CpuIsa isa) {
  validate_paged_attention(given);
  PagedAttentionParams params = given;
  const int64_t row = static_cast<int64_t>(params.num_heads) * params.cache.head_dim;
  if (params.q_token_stride == 0) params.q_token_stride = row;
  if (params.out_token_stride == 0) params.out_token_stride = row;
  plan_work(params, workspace);
  const ItemFn fn = item_function(resolve_cpu_isa(isa, params.cache.head_dim));
  const AttentionWorkspace::Work* work = workspace.work.data();
  pool.parallel_for(static_cast<int64_t>(workspace.work.size()),
                    [fn, work](int64_t i) { fn(work[i].item); });
  const AttentionWorkspace::Merge* merges = workspace.merges.data();
  const float* partials = workspace.partials.data();
  pool.parallel_for(static_cast<int64_t>(workspace.merges.size()),
                    [&params, merges, partials](int64_t i) { merge_partials(params, merges[i], partials); });
}

}  // namespace fp8serve::cpu
