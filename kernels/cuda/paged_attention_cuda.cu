// paged_attention_cuda(): checks what the host can see of the call, sizes the work for this
// device and launches the decode (+ merge) and prefill kernels (paged_attention_cuda.hpp says
// which sequences each serves and why the host needs none of the batch's contents).
//
// Workspace: [plan: (num_seqs + 1) ints, padded to 16 bytes][decode partial slots]. A slot holds
// one decode item's unnormalised output and (max, sum) per row. A sequence's partitions depend on
// its own context alone (attn::decode_partition), at most kDecodeMaxParts of them, and any item
// may own a slot: the workspace holds max_num_seqs * head_items * the most partitions a context
// of limits.max_context tokens has.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"
#include "kernels/cuda/paged_attention_kernels.hpp"

namespace fp8serve::cuda {

namespace {

using attn::AttentionArgs;
using attn::DecodeWork;

constexpr int32_t kMaxGroup = 64;    // query heads per KV head: one prefill tile holds >= 1 token

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("paged_attention_cuda: " + what); }

// The current device's SM count, asked once per device.
int32_t sm_count() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::map<int, int32_t> counts;
  std::lock_guard lock(mutex);
  if (const auto it = counts.find(device); it != counts.end()) return it->second;
  int count = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  counts.emplace(device, count);
  return count;
}

void check_shapes(int32_t num_heads, int32_t num_kv_heads, int32_t head_dim) {
  if (num_kv_heads <= 0 || num_heads <= 0 || num_heads % num_kv_heads != 0)
    fail("num_heads must be a positive multiple of num_kv_heads");
  if (num_heads / num_kv_heads > kMaxGroup) fail("more than 64 query heads per KV head");
  if (head_dim < 16 || head_dim > 256 || head_dim % 16 != 0)
    fail("head_dim " + std::to_string(head_dim) + " is not a multiple of 16 in [16, 256]");
}

int64_t subgroups(int32_t group, bool mma) {
  const int32_t rows = attn::decode_rows(group, mma);
  return (group + rows - 1) / rows;
}

std::size_t plan_bytes(int32_t num_seqs) { return (static_cast<std::size_t>(num_seqs) + 1 + 3) / 4 * 16; }

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// need_v = false: V may be null (the tail of a K-only window).
void check_view(const PagedKvView& view, const char* name, bool need_v) {
  const std::string pool(name);
  if (view.dtype != KvDtype::fp8_e4m3 && view.dtype != KvDtype::bf16) fail(pool + ": unsupported KV dtype");
  if (view.k == nullptr || (need_v && view.v == nullptr)) fail(pool + ": null K or V");
  if (view.num_blocks <= 0) fail(pool + ": no blocks");
  if (view.block_size != 8 && view.block_size != 16 && view.block_size != 32)
    fail(pool + ": block_size must be 8, 16 or 32");
  const int64_t elem = view.dtype == KvDtype::fp8_e4m3 ? 1 : 2;
  if (view.v_token_stride < view.head_dim || view.head_stride < int64_t{view.block_size} * view.head_dim ||
      view.block_stride <= 0)
    fail(pool + ": strides must be positive, head_stride >= block_size * head_dim, v_token_stride >= head_dim");
  if (view.v_token_stride * elem * view.block_size > INT32_MAX)  // the kernels' offsets inside a block
    fail(pool + ": a block's V rows span more than 2 GiB (v_token_stride x block_size)");
  if ((view.block_stride * elem) % 16 != 0 || (view.head_stride * elem) % 16 != 0 ||
      (view.v_token_stride * elem) % 16 != 0 || !aligned16(view.k) || !aligned16(view.v))
    fail(pool + ": K/V and their strides must be 16-byte aligned (the kernels read 16-byte vectors)");
}

void validate(const PagedAttentionParams& p) {
  check_view(p.cache, "cache", true);
  check_shapes(p.num_heads, p.cache.num_kv_heads, p.cache.head_dim);
  const PagedBatch& b = p.batch;
  if (b.num_seqs < 0 || b.num_tokens < b.num_seqs)
    fail("num_tokens must be >= num_seqs >= 0 (every sequence has at least one new token)");
  if (b.num_seqs == 0) return;
  if (b.query_start_loc == nullptr || b.context_lens == nullptr || b.block_tables == nullptr)
    fail("null query_start_loc, context_lens or block_tables");
  if (b.max_blocks_per_seq < 1) fail("max_blocks_per_seq must be >= 1");
  if (p.cache.dtype == KvDtype::fp8_e4m3 && (b.k_scales == nullptr || b.v_scales == nullptr))
    fail("an FP8 pool needs k_scales and v_scales");
  const int64_t row = int64_t{p.num_heads} * p.cache.head_dim;
  if (p.q == nullptr || p.out == nullptr) fail("null q or out");
  if ((p.q_token_stride != 0 && p.q_token_stride < row) || (p.out_token_stride != 0 && p.out_token_stride < row))
    fail("a token stride (not 0) < num_heads * head_dim");
  if (!std::isfinite(p.softmax_scale)) fail("softmax_scale must be finite");
  if (b.has_tail()) {
    check_view(p.tail, "tail", false);  // tail.v == nullptr: a K-only window
    if (p.tail.dtype != KvDtype::bf16 || p.tail.block_size != p.cache.block_size ||
        p.tail.head_dim != p.cache.head_dim || p.tail.num_kv_heads != p.cache.num_kv_heads)
      fail("the tail pool must be bf16 with the cache's block_size, head_dim and num_kv_heads");
    if (b.tail_slots == nullptr || b.tail_ring_blocks < 1) fail("the tail needs tail_slots and tail_ring_blocks >= 1");
  }
}

}  // namespace

std::size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaLimits& limits) {
  check_shapes(limits.num_heads, limits.num_kv_heads, limits.head_dim);
  if (limits.max_num_seqs < 1) throw std::invalid_argument("paged_attention_cuda_workspace_bytes: max_num_seqs < 1");
  const int32_t group = limits.num_heads / limits.num_kv_heads;
  // Enough for either decode kernel (options may choose the one `best` does not).
  std::size_t bytes = 0;
  for (bool mma : {false, attn::decode_on_tensor_cores(group, limits.head_dim, PagedAttentionCudaOptions::DecodeMath::mma)}) {
    const int64_t head_items = limits.num_kv_heads * subgroups(group, mma);
    const int64_t max_context = limits.max_context > 0 ? limits.max_context : int64_t{1} << 30;
    const int64_t slots = limits.max_num_seqs * head_items * attn::decode_max_parts(max_context);
    bytes = std::max(bytes, static_cast<std::size_t>(slots * attn::decode_slot_floats(group, limits.head_dim, mma)) *
                                sizeof(float));
  }
  return plan_bytes(limits.max_num_seqs) + bytes;
}

int32_t paged_attention_cuda_decode_grid(int32_t group, int32_t head_dim, int32_t num_seqs, int32_t sms) {
  const bool mma = attn::decode_on_tensor_cores(group, head_dim, PagedAttentionCudaOptions::DecodeMath::best);
  return attn::decode_grid(group, head_dim, num_seqs, sms, mma);
}

void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream) {
  paged_attention_cuda(params, workspace, workspace_bytes, stream, PagedAttentionCudaOptions{});
}

void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream, const PagedAttentionCudaOptions& options) {
  validate(params);
  const PagedBatch& batch = params.batch;
  if (batch.num_seqs == 0) return;
  const int32_t head_dim = params.cache.head_dim;
  const int32_t group = params.num_heads / params.cache.num_kv_heads;

  AttentionArgs args;
  args.q = static_cast<const uint16_t*>(params.q);
  args.out = static_cast<uint16_t*>(params.out);
  const int64_t row = int64_t{params.num_heads} * head_dim;
  args.q_token_stride = params.q_token_stride != 0 ? params.q_token_stride : row;
  args.out_token_stride = params.out_token_stride != 0 ? params.out_token_stride : row;
  args.num_heads = params.num_heads;
  args.group = group;
  args.head_dim = head_dim;
  args.qk_scale = params.softmax_scale * 1.4426950408889634f;  // log2(e): exp(x) = exp2(x log2 e)
  args.cache = params.cache;
  args.tail = params.tail;
  args.batch = batch;

  // Decode: the plan, then the partial slots.
  const int32_t sms = sm_count();
  const bool mma = attn::decode_on_tensor_cores(group, head_dim, options.decode_math);
  const int64_t head_items = params.cache.num_kv_heads * subgroups(group, mma);
  const std::size_t plan = plan_bytes(batch.num_seqs);
  const int64_t slot_bytes = attn::decode_slot_floats(group, head_dim, mma) * int64_t{sizeof(float)};
  if (workspace == nullptr || !aligned16(workspace) || workspace_bytes < plan + slot_bytes)
    fail("workspace missing, not 16-byte aligned, or smaller than paged_attention_cuda_workspace_bytes()");
  const int64_t slots = static_cast<int64_t>(workspace_bytes - plan) / slot_bytes;
  DecodeWork work;
  work.plan = static_cast<int32_t*>(workspace);
  work.partials = reinterpret_cast<float*>(static_cast<char*>(workspace) + plan);
  work.subgroups = static_cast<int32_t>(subgroups(group, mma));
  // The most partitions any sequence of this batch can have, from what the host knows (the
  // block tables' width): every one of them must find a slot.
  const int64_t max_context = int64_t{batch.max_blocks_per_seq} * params.cache.block_size;
  int64_t max_parts = attn::decode_max_parts(max_context);
  if (options.partition_tokens < 0) {
    work.partition_tokens = -1;
    max_parts = 1;
  } else if (options.partition_tokens > 0) {
    const int32_t block = params.cache.block_size;
    work.partition_tokens = (options.partition_tokens + block - 1) / block * block;
    max_parts = (max_context + work.partition_tokens - 1) / work.partition_tokens;
  }
  if (max_parts * batch.num_seqs * head_items > slots)
    fail(options.partition_tokens > 0 ? "partition_tokens too small for the workspace"
                                      : "workspace too small for " + std::to_string(batch.num_seqs) +
                                            " sequences of up to " + std::to_string(max_context) + " tokens");
  attn::launch_decode(args, work, max_parts > 1, mma, sms, stream);
  if (batch.num_tokens > batch.num_seqs) attn::launch_prefill(args, options.prefill_math, sms, stream);
}

}  // namespace fp8serve::cuda
