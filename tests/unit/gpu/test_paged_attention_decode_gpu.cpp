// [gpu] CUDA decode attention (one new token per sequence) against attention in double over what
// the pool holds: real head dims and GQA ratios (Llama-3-8B's group 4 at head_dim 128, Qwen3's
// group 2, SmolLM2's 9/3 at 64, the tiny fixtures' 16 and 32, group 8 and 16, head_dim 256 and
// the padded 80), FP8 and bf16 pools, block sizes 8/16/32, contexts that are not multiples of
// the block, split-K off / adaptive / forced into many partitions, and the bf16 tail with
// fp8_lens at and around block boundaries. Runs on the GPU (test_gpu) and on the emulator
// (test_paged_attention_decode_gpu_emu) alike.
//
// Tolerance. The output is bf16, so each element may be off by its rounding, up to 2^-8 of
// |reference|; the check is on what remains, as a fraction of the sequence's largest |v|: the
// kernels compute in fp32 what the reference computes in double over the same stored values (q is
// bf16 in both), so only fp32 sums over at most a few thousand keys remain, ~1e-6 (measured on
// the emulator: <= 4e-8). Limit 1e-4. A wrong scale, partition merge, mask or tail slot is off by
// O(1) (or leaves an output NaN: every output starts as NaN).
#include "tests/unit/gpu/paged_attention_cuda_case.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

// Decode tokens keep fp32 probabilities: 1e-4 (attention_tolerance), looser only for the cases
// that mix in prefill chunks, which run on tensor cores.
void check_case(const CudaAttentionCase& c) { check_cuda_attention_case(c, attention_tolerance(c)); }

std::vector<SeqSpec> decode_seqs(std::initializer_list<int32_t> contexts) {
  std::vector<SeqSpec> seqs;
  for (int32_t len : contexts) seqs.push_back({len, 1});
  return seqs;
}

}  // namespace

TEST_CASE("CUDA decode attention matches the reference at real shapes", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 100;
  for (const CaseShape& shape : model_shapes())
    for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16})
      check_case(shaped_case(shape, dtype, decode_seqs({1, 17, 100, 333}), seed++));
}

TEST_CASE("CUDA decode attention: split-K off, adaptive and forced give the same result", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  for (int32_t partition : {-1, 0, 16, 48, 256}) {
    for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
      CudaAttentionCase c;
      c.dtype = dtype;
      c.seqs = decode_seqs({700, 5, 1500, 64, 257});
      c.block_size = partition == 48 ? 8 : 16;
      c.options.partition_tokens = partition;
      c.seed = 200 + static_cast<uint32_t>(partition + 1);
      check_case(c);
    }
  }
}

TEST_CASE("CUDA decode attention reads the bf16 tail above fp8_lens in the same softmax", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  for (int32_t block_size : {8, 16, 32}) {
    for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
      // fp8_lens at, just below and just above block boundaries; all in the tail; none in it.
      CudaAttentionCase c;
      c.dtype = dtype;
      c.block_size = block_size;
      c.seqs = decode_seqs({3 * block_size + 5, 4 * block_size, 2 * block_size + 1, 7, 5 * block_size + 3, 300});
      c.fp8_lens = {2 * block_size, 3 * block_size - 1, block_size + 1, 0, 5 * block_size + 3, 300 - 2 * block_size};
      c.tail_ring_blocks = 3;
      c.seed = 300 + static_cast<uint32_t>(block_size);
      check_case(c);
      c.options.partition_tokens = 2 * block_size;  // partitions that start inside the tail
      check_case(c);
      if (dtype == KvDtype::fp8_e4m3) {
        c.tail_k_only = true;  // K from the tail, V from the FP8 pool with its scale
        check_case(c);
      }
    }
  }
}

TEST_CASE("CUDA attention plans batches of hundreds of sequences", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  // More sequences than the kernels' 128 threads: each thread scans several in the plan, and
  // the items of one CTA belong to many sequences. Some prefill chunks among the decodes.
  CudaAttentionCase c = shaped_case(model_shapes()[1], KvDtype::fp8_e4m3, {}, 900);  // Llama-3-8B
  for (int32_t i = 0; i < 300; ++i) c.seqs.push_back({1 + (i * 37) % 90, i % 50 == 7 ? 5 : 1});
  check_case(c);
  c.options.partition_tokens = 32;
  check_case(c);
}

TEST_CASE("the decode grid is the device's occupancy: an H200's in the emulator", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // Llama-3-8B shapes (GQA 4, head_dim 128): ptxas gives the <128, 4> build 162 registers on
  // sm_90a, which lets an SM hold 3 of its 128-thread CTAs (kernels/cuda/emu/kernel_resources.inc).
  const int32_t grid = cuda::paged_attention_cuda_decode_grid(4, 128, 64, sms);
  INFO("decode grid " << grid << " on " << sms << " SMs");
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
  CHECK(grid == 132 * 3);
#else
  CHECK(grid % sms == 0);
#endif
  CHECK(cuda::paged_attention_cuda_decode_grid(1, 64, 64, sms) >= grid);  // fewer registers: at least as many CTAs
}
