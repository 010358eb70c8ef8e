#pragma once
// Between paged_attention_cuda.cu (validation, dispatch, workspace) and the kernels' files
// (paged_attention_decode.cu, paged_attention_prefill.cu): the arguments every attention kernel
// reads, passed by value, and the launchers.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <compare>
#include <map>
#include <mutex>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/launch.hpp"
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
  int32_t* plan = nullptr;       // [num_seqs + 1] items before each sequence, written for the merge
  float* partials = nullptr;     // per slot: [rows][dim_pad] unnormalised outputs, then [rows] (max, sum)
  int32_t partition_tokens = 0;  // 0 decode_partition(), > 0 fixed (a multiple of block_size), < 0 never split
  int32_t subgroups = 0;         // per KV head: ceil(group / rows)
};

// A decode sequence's partition size in tokens: a function of its own readable context `len`
// alone (never of the batch: batch invariance), at least kDecodeMinPartition tokens, at most
// kDecodeMaxParts partitions (which bounds the workspace per sequence), whole blocks. The floor
// weighs batch 1 against a full batch: each item costs a warp ~1,100 instructions besides its
// chunks (plan, q, the first copies, the warps' merge), so 256-token items (4 chunks a warp)
// left a batch of 64 at 8k issue-bound at ~70% of HBM, and 512 (8 chunks) reach ~87% by the
// static model (docs/cuda.md), while batch 1 at 8k keeps 16 partitions x the KV heads (128
// items for 8 KV heads on 132 SMs) and 32 from 16k tokens on. vLLM's paged attention v2 cuts at
// 512 too.
constexpr int32_t kDecodeMinPartition = 512;
constexpr int32_t kDecodeMaxParts = 32;
__host__ __device__ inline int32_t decode_partition(int32_t len, int32_t block_size) {
  int32_t p = (len + kDecodeMaxParts - 1) / kDecodeMaxParts;
  p = p > kDecodeMinPartition ? p : kDecodeMinPartition;
  return (p + block_size - 1) & -block_size;  // block_size: 8, 16 or 32 (paged_attention_cuda checks)
}
// Partitions of a context of up to max_len tokens: at most kDecodeMaxParts.
inline int64_t decode_max_parts(int64_t max_len) {
  const int64_t parts = (max_len + kDecodeMinPartition - 1) / kDecodeMinPartition;
  return parts < kDecodeMaxParts ? parts : kDecodeMaxParts;
}

// A persistent grid: as many CTAs of `kernel` as the device holds at once - its occupancy with
// this block size and dynamic shared memory, times the SMs - on the GPU and in the emulator alike
// (which computes an H200's occupancy from ptxas's register counts), so grids, split decisions
// and partition plans are the GPU's. The kernel is allowed its shared memory first. Both are
// asked once per (device, kernel, shared bytes) - the attribute and the occupancy are per device
// - and cached: a step makes no runtime call for them. The dynamic shared memory limit is only
// ever raised: a CUDA graph captured with a larger launch must stay launchable after a smaller
// one has run.
template <class Kernel>
int32_t persistent_grid(Kernel* kernel, int threads, std::size_t shared, int32_t sms) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  struct Key {
    int device;
    const void* kernel;
    std::size_t shared;
    auto operator<=>(const Key&) const = default;
  };
  static std::mutex mutex;
  static std::map<Key, int32_t> grids;
  static std::map<std::pair<int, const void*>, std::size_t> allowed;  // the raised limit, per device
  std::lock_guard lock(mutex);
  const Key key{device, reinterpret_cast<const void*>(kernel), shared};
  if (const auto it = grids.find(key); it != grids.end()) return it->second;
  if (shared > 48 * 1024) {
    std::size_t& limit = allowed[{device, key.kernel}];
    if (shared > limit) {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
      limit = shared;
    }
  }
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, shared));
  const int32_t grid = sms * (per_sm > 0 ? per_sm : 1);
  grids.emplace(key, grid);
  return grid;
}

// Whether the decode runs on tensor cores (paged_decode_mma_kernel) for this GQA group and head
// dim: `best` does from group 4 on, `mma` at any group; both only up to head_dim 128
// (decode_mma.cuh says why), beyond which the CUDA-core kernel runs whatever the option.
bool decode_on_tensor_cores(int32_t group, int32_t head_dim, PagedAttentionCudaOptions::DecodeMath math);
// Query heads one decode item serves: on CUDA cores 1, 2, 4 or 8 (the whole GQA group when it has
// at most 8), on tensor cores 8 or 16 (one MMA row block; groups up to 16 in one item).
int32_t decode_rows(int32_t group, bool mma);
// The compiled head dimension a head_dim runs under: the next of 32, 64, 128, 256.
int32_t padded_head_dim(int32_t head_dim);
// Floats of one decode partial slot for these shapes (rows * (dim_pad + 2)).
int64_t decode_slot_floats(int32_t group, int32_t head_dim, bool mma);
// The decode kernel's persistent grid for these shapes and up to num_seqs sequences.
int32_t decode_grid(int32_t group, int32_t head_dim, int32_t num_seqs, int32_t sms, bool mma);
// The decode kernel over the sequences with one new token, then (when may_split) the merge.
void launch_decode(const AttentionArgs& args, const DecodeWork& work, bool may_split, bool mma, int32_t sms,
                   cudaStream_t stream);

// The prefill kernel over the sequences with two or more new tokens.
void launch_prefill(const AttentionArgs& args, PagedAttentionCudaOptions::PrefillMath math, int32_t sms,
                    cudaStream_t stream);

}  // namespace fp8serve::cuda::attn
