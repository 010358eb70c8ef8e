#pragma once
// Between paged_attention_cuda.cu (validation, dispatch, workspace) and the kernels' files
// (paged_attention_decode.cu, paged_attention_prefill.cu): the arguments every attention kernel
// reads, passed by value, and the launchers.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/paged_attention_cuda.hpp"
#include "kernels/paged_kv.hpp"

namespace fp8serve::cuda::attn {

// What every attention kernel reads. q/out are bf16 bits; token strides are in elements and
// already resolved (never 0).
struct AttentionArgs {
  const uint16_t* q = nullptr;  // [num_tokens, num_heads, head_dim]
  uint16_t* out = nullptr;      // [num_tokens, num_heads, head_dim]
  int64_t q_token_stride = 0;
  int64_t out_token_stride = 0;
  int32_t num_heads = 0;
  int32_t group = 0;  // query heads per KV head
  int32_t head_dim = 0;
  float qk_scale = 0.0f;  // softmax_scale * log2(e): scores are kept in log2 units for exp2
  PagedKvView cache;
  PagedKvView tail;  // read only when batch.has_tail()
  PagedBatch batch;
};

// Decode items: (sequence, KV head, subgroup of at most decode_rows(group) of its query heads,
// context partition); see paged_attention_decode.cu.
struct DecodeWork {
  int32_t* plan = nullptr;      // [num_seqs + 1] items before each sequence, written for the merge
  float* partials = nullptr;    // [slots][rows][dim_pad] unnormalised outputs, then [slots][rows] (max, sum)
  int32_t target_items = 0;     // adaptive partitions aim at about this many items
  int32_t partition_tokens = 0; // 0 adaptive, > 0 fixed (a multiple of block_size), < 0 never split
  int32_t subgroups = 0;        // per KV head: ceil(group / rows)
  int32_t grid = 0;             // CTAs of the decode kernel (a persistent grid)
};

// Query heads one decode item serves (1, 2, 4 or 8): the whole GQA group when it has at most 8.
int32_t decode_rows(int32_t group);
// The compiled head dimension a head_dim runs under: the next of 32, 64, 128, 256.
int32_t padded_head_dim(int32_t head_dim);
// Floats of one decode partial slot for these shapes (rows * (dim_pad + 2)).
int64_t decode_slot_floats(int32_t group, int32_t head_dim);
// Dynamic shared memory of the decode kernel for a batch of num_seqs sequences.
std::size_t decode_shared_bytes(int32_t group, int32_t head_dim, int32_t num_seqs);
// Decode kernel CTAs resident per SM that the persistent grid is sized for.
constexpr int32_t kDecodeCtasPerSm = 4;
// Adaptive decode partitions are never shorter than this many tokens: shorter ones cost more to
// merge than they gain.
constexpr int32_t kDecodeMinPartition = 256;

// The decode kernel over the sequences with one new token, then (when may_split) the merge.
void launch_decode(const AttentionArgs& args, const DecodeWork& work, bool may_split, cudaStream_t stream);

// The prefill kernel over the sequences with two or more new tokens.
void launch_prefill(const AttentionArgs& args, PagedAttentionCudaOptions::PrefillMath math, int32_t grid,
                    cudaStream_t stream);
constexpr int32_t kPrefillCtasPerSm = 2;

}  // namespace fp8serve::cuda::attn
