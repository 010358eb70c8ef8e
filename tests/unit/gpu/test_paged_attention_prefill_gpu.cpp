// [gpu] CUDA prefill and chunked-prefill attention, and mixed batches (decode tokens and chunks
// in one call), against attention in double over what the pool holds: real head dims and GQA
// ratios, FP8 and bf16 pools, block sizes 8/16/32, chunks that start after a cached prefix, are
// not multiples of the block or of the query tile, the bf16 tail, and both implementations of
// the tile math (tensor-core MMA, the GPU's default, and SIMT), every shape with each. Runs on the
// GPU (test_gpu) and on the emulator (test_paged_attention_prefill_gpu_emu), which runs the very
// mma.sync and cp.async code (tests/cuda_emu/ptx.hpp) - in each of its mma accumulation orders for
// the MMA cases, since a tensor core's order is not documented.
//
// Tolerances (attention_tolerance), on the error beyond rounding the bf16 output (up to 2^-8
// |reference|), as a fraction of the sequence's largest |v|:
// - SIMT (fp32 probabilities): fp32 against double over the same values, ~1e-6 (measured on the
//   emulator: <= 4e-8). Limit 1e-4, as for decode.
// - MMA: the probabilities are rounded to bf16 for the P V product, each weight off by up to 2^-8
//   relative while the normaliser sums the fp32 values: up to 2^-8 max|v| (measured on the
//   emulator: <= 6e-4 in every accumulation order). Limit 4e-3; tensor cores' products of bf16
//   are exact and they accumulate in fp32.
#include "tests/unit/gpu/paged_attention_cuda_case.hpp"

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
#include "kernels/cuda/launch.hpp"  // fp8serve::emu::set_mma_order
#endif

using namespace fp8serve;
using namespace fp8serve::test;
using Math = fp8serve::cuda::PagedAttentionCudaOptions::PrefillMath;

namespace {

void check_case(const CudaAttentionCase& c) { check_cuda_attention_case(c, attention_tolerance(c)); }

}  // namespace

namespace {

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
constexpr int kMmaOrders = 4;  // fp8serve::emu::MmaOrder's
void use_mma_order(int order) { fp8serve::emu::set_mma_order(static_cast<fp8serve::emu::MmaOrder>(order)); }
#else
constexpr int kMmaOrders = 1;  // the GPU's own
void use_mma_order(int) {}
#endif

// The case with each prefill math, MMA in every accumulation order the emulator has.
void check_both_maths(CudaAttentionCase c) {
  c.options.prefill_math = Math::simt;
  check_case(c);
  c.options.prefill_math = Math::best;  // mma
  for (int order = 0; order < kMmaOrders; ++order) {
    use_mma_order(order);
    INFO("mma accumulation order " << order);
    check_case(c);
  }
  use_mma_order(0);
}

}  // namespace

TEST_CASE("CUDA prefill attention matches the reference at real shapes, MMA and SIMT", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 400;
  for (const CaseShape& shape : model_shapes()) {
    for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
      // A fresh prompt, a chunk after a cached prefix, a two-token chunk.
      check_both_maths(shaped_case(shape, dtype, {{37, 37}, {150, 41}, {66, 2}}, seed++));
    }
  }
}

TEST_CASE("CUDA attention serves decode tokens and prefill chunks in one batch", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    for (int32_t partition : {0, 32}) {
      CudaAttentionCase c;
      c.dtype = dtype;
      c.num_heads = 9;
      c.num_kv_heads = 3;
      c.head_dim = 64;
      c.seqs = {{300, 1}, {45, 20}, {1, 1}, {90, 90}, {513, 1}};
      c.options.partition_tokens = partition;
      c.seed = 500 + static_cast<uint32_t>(partition);
      check_both_maths(c);
    }
  }
}

TEST_CASE("CUDA prefill attention reads the bf16 tail above fp8_lens", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    CudaAttentionCase c;
    c.dtype = dtype;
    c.block_size = 16;
    // The chunk partly in the FP8 pool, wholly in the tail, starting inside the tail.
    c.seqs = {{100, 30}, {40, 40}, {75, 3}, {60, 1}};
    c.fp8_lens = {80, 0, 64, 47};
    c.tail_ring_blocks = 3;
    c.seed = 600;
    check_both_maths(c);
    if (dtype == KvDtype::fp8_e4m3) {
      c.tail_k_only = true;
      check_both_maths(c);
    }
  }
}

TEST_CASE("CUDA prefill attention: partial tiles, the causal edge and both key-tile sizes", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  CudaAttentionCase c;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.seqs = {{70, 35}, {20, 3}};
  c.seed = 700;
  check_both_maths(c);
  c.dtype = KvDtype::bf16;
  c.block_size = 8;
  check_both_maths(c);
  c.dtype = KvDtype::fp8_e4m3;
  c.head_dim = 128;
  c.num_heads = 8;
  c.seqs = {{40, 18}};
  c.fp8_lens = {32};
  c.tail_ring_blocks = 2;
  c.block_size = 16;
  check_both_maths(c);
  c.fp8_lens.clear();
  c.head_dim = 32;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.seqs = {{33, 33}};
  check_both_maths(c);
}
