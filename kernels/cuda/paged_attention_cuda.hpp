#pragma once
// CUDA paged attention over one layer's pool (kernels/paged_attention.hpp for the math,
// kernels/paged_kv.hpp for the layout): q and out in bf16, K/V read from the FP8 (or bf16) pool
// and converted in registers, plus the bf16 tail pool of the recent window when
// batch.has_tail(). Decode tokens and prefill chunks may share one batch.
//
// Dispatch (paged_attention_cuda.cu): the kernels plan their own work on the device from
// query_start_loc and context_lens, so the host needs none of the batch's contents and every
// launch has a grid fixed by host-side integers (CUDA graphs capture it as is):
//   1. decode kernel: the sequences with exactly one new token, on CUDA cores below GQA group 4
//      and on tensor cores from it on (head_dim <= 128); work items (sequence, KV head, context
//      partition), flash-decoding: a sequence's partition size is a function of its own context
//      length alone (256 tokens, or a 32nd of the context beyond 8k), so its result is bitwise
//      the same in any batch (batch invariance: speculative decoding verifies a token as its
//      own decode step would compute it);
//   2. merge kernel: combines the partitions of split sequences (skipped when no context can
//      exceed the smallest partition);
//   3. prefill kernel: the sequences with two or more new tokens (prefill and chunked-prefill
//      chunks); work items (sequence, KV head, tile of query tokens x the GQA group's heads);
//      launched only when num_tokens > num_seqs.
// Dispatch relies on PRECOND (below) that every sequence has at least one new token.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/paged_attention.hpp"

namespace fp8serve::cuda {

// What the backend knows at start-up; sizes the one workspace every later call uses.
struct PagedAttentionCudaLimits {
  int32_t max_num_seqs = 0;  // sequences per step (--max-num-seqs; with speculation, verified rows)
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t max_context = 0;  // tokens a sequence may hold (--max-model-len); 0 = no bound
};

// Bytes of device workspace for any step within `limits` on the current device (the decode
// plan and the split partitions' partial results). Throws std::invalid_argument for shapes the
// kernels do not support (head_dim not a multiple of 16 in [16, 256], num_heads not a multiple of
// num_kv_heads, more than 64 query heads per KV head).
std::size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaLimits& limits);

// softmax(q k^T * softmax_scale) v for every query token of params.batch, queued on `stream`.
// Device pointers: params.q, params.out ([num_tokens, num_heads, head_dim] bf16 with token
// strides), the pools, every array of params.batch; host values: every integer field.
// PRECOND: kv_write for this step has run on `stream`; every sequence has at least one new
// token; workspace (device memory, 16-byte aligned) holds paged_attention_cuda_workspace_bytes()
// for limits that cover this call.
// Throws std::invalid_argument when the host-visible fields break the contract (shapes, dtypes,
// strides, a workspace too small) and std::runtime_error for CUDA errors. Device-side contents
// are trusted as the CPU kernel checks them (kernels/cpu/paged_kv_check.hpp), except that a
// block id outside the pool reads zeros instead of faulting.
void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream);

// The decode kernel's persistent grid for these shapes on the current device (its occupancy
// times `sms`): what paged_attention_cuda() launches by default, for tests and benchmarks.
int32_t paged_attention_cuda_decode_grid(int32_t group, int32_t head_dim, int32_t num_seqs, int32_t sms);

// Knobs for tests and benchmarks; the defaults are what paged_attention_cuda() runs.
struct PagedAttentionCudaOptions {
  enum class PrefillMath : uint8_t {
    best,  // what the GPU runs by default: mma
    mma,   // tensor cores: bf16 mma.sync, P rounded to bf16 for P V
    simt,  // CUDA cores, fp32 P: more exact, slower
  };
  PrefillMath prefill_math = PrefillMath::best;
  enum class DecodeMath : uint8_t {
    best,  // what the GPU runs by default: mma from GQA group 4 on, simt below
    mma,   // tensor cores: f16 (FP8 K/V) or bf16 mma.sync, P rounded to f16 / bf16 for P V;
           // head_dim <= 128 only (beyond it simt runs, as for best)
    simt,  // CUDA cores, fp32 throughout
  };
  DecodeMath decode_math = DecodeMath::best;
  // Decode partition size in tokens: 0 = a function of each sequence's own context (batch
  // invariant; the default), > 0 = at most this many tokens per partition (rounded up to whole
  // blocks), < 0 = never split.
  int32_t partition_tokens = 0;
};
void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream, const PagedAttentionCudaOptions& options);

}  // namespace fp8serve::cuda
