#include "kernels/cpu/paged_kv_check.hpp"

#include <cfloat>
#include <stdexcept>
#include <string>

#include "kernels/cpu/attention_item.hpp"

namespace fp8serve::cpu {

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("paged KV: " + what); }

}  // namespace

void validate_paged_kv_view(const PagedKvView& view, bool v_optional) {
  if (view.dtype != KvDtype::fp8_e4m3 && view.dtype != KvDtype::bf16) fail("unknown KV dtype");
  if (view.k == nullptr || (view.v == nullptr && !v_optional)) fail("null K or V pool");
  if (view.num_blocks <= 0 || view.block_size <= 0 || view.num_kv_heads <= 0) {
    fail("num_blocks, block_size and num_kv_heads must be > 0");
  }
  if (view.head_dim <= 0 || view.head_dim > kMaxHeadDim) {
    fail("head_dim " + std::to_string(view.head_dim) + " outside [1, " + std::to_string(kMaxHeadDim) + "]");
  }
  const int32_t pack = kv_k_pack(view.dtype);
  if (view.head_dim % pack != 0) {
    fail("head_dim " + std::to_string(view.head_dim) + " is not a multiple of " + std::to_string(pack) +
         " (K is stored in 4-byte groups)");
  }
  if (view.v_token_stride < view.head_dim || view.block_stride <= 0 ||
      view.head_stride < static_cast<int64_t>(view.block_size) * view.head_dim) {
    fail("strides must be positive, head_stride >= block_size * head_dim and v_token_stride >= head_dim");
  }
}

void validate_query_starts(const PagedBatch& batch) {
  if (batch.num_seqs < 0 || batch.num_tokens < 0) fail("negative num_seqs or num_tokens");
  if (batch.query_start_loc == nullptr) fail("null query_start_loc");
  if (batch.query_start_loc[0] != 0) fail("query_start_loc[0] must be 0");
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    if (batch.query_start_loc[s + 1] < batch.query_start_loc[s]) fail("query_start_loc decreases");
  }
  if (batch.query_start_loc[batch.num_seqs] != batch.num_tokens) {
    fail("query_start_loc[num_seqs] != num_tokens");
  }
}

void validate_block_tables(const PagedBatch& batch, const PagedKvView& view) {
  if (batch.num_seqs > 0 && (batch.context_lens == nullptr || batch.block_tables == nullptr)) {
    fail("null context_lens or block_tables");
  }
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const int32_t num_new = batch.num_new_tokens(s);
    const int32_t context_len = batch.context_lens[s];
    if (num_new == 0) continue;  // nothing to attend for this sequence this step
    if (context_len < num_new) {
      fail("sequence " + std::to_string(s) + ": context_len " + std::to_string(context_len) +
           " < its " + std::to_string(num_new) + " new tokens");
    }
    const int64_t num_blocks = (static_cast<int64_t>(context_len) + view.block_size - 1) / view.block_size;
    if (num_blocks > batch.max_blocks_per_seq) {
      fail("sequence " + std::to_string(s) + " needs " + std::to_string(num_blocks) +
           " blocks, block table holds " + std::to_string(batch.max_blocks_per_seq));
    }
    const int32_t* table = batch.block_table(s);
    for (int64_t b = 0; b < num_blocks; ++b) {
      if (table[b] < 0 || table[b] >= view.num_blocks) {
        fail("sequence " + std::to_string(s) + " block " + std::to_string(b) + " has id " +
             std::to_string(table[b]) + ", pool has " + std::to_string(view.num_blocks));
      }
    }
  }
}

void validate_scales(const PagedBatch& batch, const PagedKvView& view) {
  if (view.dtype != KvDtype::fp8_e4m3) return;
  if (batch.num_seqs > 0 && (batch.k_scales == nullptr || batch.v_scales == nullptr)) {
    fail("FP8 pool needs k_scales and v_scales");
  }
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const float k = batch.k_scales[s];
    const float v = batch.v_scales[s];
    if (!(k > 0.0f && k <= FLT_MAX && v > 0.0f && v <= FLT_MAX)) {
      fail("sequence " + std::to_string(s) + " has a K/V scale that is not finite and > 0");
    }
  }
}

void validate_tail(const PagedBatch& batch, const PagedKvView& cache, const PagedKvView& tail) {
  if (!batch.has_tail()) return;
  if (cache.dtype != KvDtype::fp8_e4m3) fail("the bf16 window needs an FP8 main pool");
  validate_paged_kv_view(tail, true);
  if (tail.dtype != KvDtype::bf16 || tail.block_size != cache.block_size || tail.num_kv_heads != cache.num_kv_heads ||
      tail.head_dim != cache.head_dim) {
    fail("the tail pool must be bf16 with the main pool's block_size, num_kv_heads and head_dim");
  }
  if (batch.tail_slots == nullptr || batch.tail_ring_blocks <= 0) fail("null tail_slots or tail_ring_blocks <= 0");
  if (batch.num_seqs > 0 && batch.context_lens == nullptr) fail("null context_lens");
  const int64_t ring_tokens = static_cast<int64_t>(batch.tail_ring_blocks) * cache.block_size;
  const int64_t num_rings = tail.num_blocks / batch.tail_ring_blocks;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const std::string name = "sequence " + std::to_string(s);
    if (batch.tail_slots[s] < 0 || batch.tail_slots[s] >= num_rings) {
      fail(name + " has tail ring " + std::to_string(batch.tail_slots[s]) + ", the tail pool holds " +
           std::to_string(num_rings));
    }
    const int32_t fp8_len = batch.fp8_lens[s];
    const int32_t context_len = batch.context_lens[s];
    if (fp8_len < 0 || fp8_len > context_len || context_len - fp8_len > ring_tokens) {
      fail(name + ": fp8_len " + std::to_string(fp8_len) + " outside [context_len - " + std::to_string(ring_tokens) +
           ", context_len " + std::to_string(context_len) + "]");
    }
  }
}

}  // namespace fp8serve::cpu
