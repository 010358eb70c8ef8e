// [gpu] Every attention kernel the backend compiles runs, each against attention in double over
// what the pools hold (paged_attention_cuda_case.hpp). The CUDA-core decode kernel is built per
// (padded head_dim 32/64/128/256, rows 1/2/4/8 of a GQA group per item) and, inside, per segment
// kind (an FP8 pool, a bf16 pool, the bf16 K-only tail over an FP8 pool's V): each build runs each
// kind, block sizes 8, 16 and 32 in turn. The tensor-core decode kernel is built per (head_dim
// 32/64/128, 8 or 16 rows) and, inside, per segment kind and chunk size (min(block, 2 KiB of K)
// tokens: 8, 16 or 32): each build runs each kind at each block size. GQA groups 1-16 each run decode and prefill (SIMT and MMA):
// the groups that fill no build exactly (3, 5-7, 9-15) leave rows of the last item empty. The
// shape tests (test_paged_attention_*_gpu) sweep the real models; this one the builds.
// Tolerances as there (attention_tolerance).
#include "tests/unit/gpu/paged_attention_cuda_case.hpp"

using namespace fp8serve;
using namespace fp8serve::test;
using Math = fp8serve::cuda::PagedAttentionCudaOptions::PrefillMath;
using DecodeMath = fp8serve::cuda::PagedAttentionCudaOptions::DecodeMath;

namespace {

void check_case(const CudaAttentionCase& c) { check_cuda_attention_case(c, attention_tolerance(c)); }

// One KV head serving `group` query heads, each of 2 sequences at head_dim `dim`.
CudaAttentionCase build_case(int32_t dim, int32_t group, int32_t block_size, KvDtype dtype, std::vector<SeqSpec> seqs,
                             uint32_t seed) {
  return shaped_case(CaseShape{group, 1, dim, block_size}, dtype, std::move(seqs), seed);
}

}  // namespace

// An FP8 pool under a K-only bf16 window (FP8 segments, then the tail's bf16 K with FP8 V), then a
// bf16 pool (bf16 K and V segments), both through `math`.
void check_segment_kinds(int32_t dim, int32_t group, int32_t block_size, DecodeMath math, uint32_t& seed) {
  CudaAttentionCase window = build_case(dim, group, block_size, KvDtype::fp8_e4m3, {{37, 1}, {21, 1}}, seed++);
  window.fp8_lens = {16, 9};
  window.tail_ring_blocks = 3;
  window.tail_k_only = true;
  window.options.decode_math = math;
  check_case(window);
  CudaAttentionCase bf16 = build_case(dim, group, block_size, KvDtype::bf16, {{37, 1}, {21, 1}}, seed++);
  bf16.options.decode_math = math;
  check_case(bf16);
}

TEST_CASE("every CUDA-core decode build runs every segment kind", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 1000;
  int turn = 0;
  for (int32_t dim : {32, 64, 128, 256})
    for (int32_t group : {1, 2, 4, 8}) check_segment_kinds(dim, group, 8 << (turn++ % 3), DecodeMath::simt, seed);
}

TEST_CASE("every tensor-core decode build runs every segment kind at every chunk size", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 1050;
  for (int32_t dim : {32, 64, 128})
    for (int32_t group : {8, 16})
      for (int32_t block_size : {8, 16, 32}) check_segment_kinds(dim, group, block_size, DecodeMath::mma, seed);
}

TEST_CASE("GQA groups 1 to 16 each run decode and prefill", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 1100;
  for (int32_t group = 1; group <= 16; ++group) {
    const KvDtype dtype = group % 2 ? KvDtype::fp8_e4m3 : KvDtype::bf16;
    INFO("group " << group);
    check_case(build_case(64, group, 16, dtype, {{29, 1}, {3, 1}}, seed++));
    for (Math math : {Math::simt, Math::best}) {
      CudaAttentionCase prefill = build_case(64, group, 16, dtype, {{21, 21}, {40, 3}, {9, 1}}, seed++);
      prefill.options.prefill_math = math;
      check_case(prefill);
    }
  }
}
