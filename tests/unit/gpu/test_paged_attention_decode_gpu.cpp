// [gpu] CUDA decode attention (one new token per sequence) against attention in double over what
// the pool holds: real head dims and GQA ratios (Llama-3-8B's group 4 at head_dim 128, Qwen3's
// group 2, SmolLM2's 9/3 at 64, the tiny fixtures' 16 and 32, group 8 and 16, head_dim 256 and
// the padded 80), FP8 and bf16 pools, block sizes 8/16/32, contexts that are not multiples of
// the block, split-K off / per-sequence / forced into many partitions, and the bf16 tail with
// fp8_lens at and around block boundaries. Runs on the GPU (test_gpu) and on the emulator
// (test_paged_attention_decode_gpu_emu) alike.
//
// Both decode kernels run: CUDA cores (groups below 4 by default) and tensor cores (4 and more),
// each forced through the other's groups too (PagedAttentionCudaOptions::decode_math), the MMA
// one in every accumulation order the emulator has.
//
// Tolerance. The output is bf16, so each element may be off by its rounding, up to 2^-8 of
// |reference|; the check is on what remains, as a fraction of the sequence's largest |v|:
// - CUDA cores: fp32 over the same stored values the reference takes in double (q is bf16 in
//   both), so only fp32 sums over at most a few thousand keys remain, ~1e-6 (measured on the
//   emulator: <= 4e-8). Limit 1e-4.
// - tensor cores: q enters exactly (bf16, or f16 after an exact power-of-two scaling), E4M3 and
//   bf16 K/V exactly, products are exact and sums fp32; what remains is P rounded for P V: to f16
//   for FP8 V, relative error <= 2^-11 per probability (absolute <= 2^-25 below f16's normal
//   range), so the output moves by at most 2^-11 max|v| = 4.9e-4: limit 1e-3; to bf16 for bf16
//   V (the MMA's operand types must match): 2^-8 max|v| = 3.9e-3: limit 4e-3
//   (attention_tolerance).
// A wrong scale, partition merge, mask or tail slot is off by O(1) (or leaves an output NaN:
// every output starts as NaN).
//
// Batch invariance is checked bitwise: a sequence's output does not depend on the rest of the
// batch, nor on whether its neighbours are the rows of a speculative verification (the same
// blocks at the previous lengths).
#include "tests/unit/gpu/paged_attention_cuda_case.hpp"

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
#include "kernels/cuda/launch.hpp"  // fp8serve::emu::set_mma_order
#endif

using namespace fp8serve;
using namespace fp8serve::test;
using DecodeMath = fp8serve::cuda::PagedAttentionCudaOptions::DecodeMath;

namespace {

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
constexpr int kMmaOrders = 4;  // sequential, pairwise, reversed, wide
void use_mma_order(int order) { fp8serve::emu::set_mma_order(static_cast<fp8serve::emu::MmaOrder>(order)); }
#else
constexpr int kMmaOrders = 1;  // the GPU's own
void use_mma_order(int) {}
#endif

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

TEST_CASE("CUDA decode attention: split-K off, per-sequence and forced give the same result", "[gpu][attention]") {
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

namespace {

// One FP8 pool holding one long context (random E4M3 codes) and random bf16 queries; run(lens)
// attends one decode token per entry of lens, every sequence over a prefix of that context (the
// same block table), and returns the output bits of the last one. q_pad: elements between one
// token's query row and the next (0: packed).
struct SharedContext {
  static constexpr int32_t kBlock = 32, kDim = 32;
  int32_t num_heads, num_kv_heads, num_blocks;
  std::vector<int32_t> table;
  cuda::DeviceBuffer k, v, q, k_scales, v_scales;
  cuda::PagedAttentionCudaOptions options;
  int64_t q_pad = 0;

  SharedContext(int32_t heads, int32_t kv_heads, int32_t max_len, uint32_t seed)
      : num_heads(heads), num_kv_heads(kv_heads), num_blocks((max_len + kBlock - 1) / kBlock) {
    std::mt19937 rng(seed);
    const auto pool_bytes = static_cast<std::size_t>(num_blocks) * kBlock * num_kv_heads * kDim;
    auto random_codes = [&] {
      std::vector<uint8_t> codes(pool_bytes);
      std::uniform_int_distribution<int> code(0, 255);
      for (auto& c : codes) {
        const int x = code(rng);
        c = static_cast<uint8_t>(x % 128 == 127 ? 0 : x);  // 0x7f and 0xff are E4M3's NaNs
      }
      return codes;
    };
    k = detail::upload(random_codes());
    v = detail::upload(random_codes());
    std::vector<uint16_t> q_bits(static_cast<std::size_t>(num_heads) * kDim);
    for (auto& h : q_bits) h = bf16_encode(std::normal_distribution<float>(0.0f, 1.0f)(rng));
    q = detail::upload(q_bits);
    // Small keys (|k| <= 0.45: a flat softmax, every key counts, as a cut would show) and values
    // up to 4.5.
    k_scales = detail::upload(std::vector<float>(1024, 0.001f));
    v_scales = detail::upload(std::vector<float>(1024, 0.01f));
    for (int32_t b = 0; b < num_blocks; ++b) table.push_back((b * 7) % num_blocks);  // scattered
  }

  std::vector<uint16_t> run(const std::vector<int32_t>& lens) const {
    const auto n = static_cast<int32_t>(lens.size());
    std::vector<int32_t> starts(static_cast<std::size_t>(n) + 1), tables;
    std::iota(starts.begin(), starts.end(), 0);
    for (int32_t s = 0; s < n; ++s) tables.insert(tables.end(), table.begin(), table.end());
    auto d_starts = detail::upload(starts), d_lens = detail::upload(lens), d_tables = detail::upload(tables);
    // Every token reads the same query row (copies, q_pad apart).
    const int64_t row = int64_t{num_heads} * kDim, q_stride = row + q_pad;
    cuda::DeviceBuffer d_q(static_cast<std::size_t>(n * q_stride) * sizeof(uint16_t));
    for (int32_t s = 0; s < n; ++s)
      CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(d_q.data()) + s * q_stride, q.data(),
                            static_cast<std::size_t>(row) * sizeof(uint16_t), cudaMemcpyDeviceToDevice));
    cuda::DeviceBuffer d_out(static_cast<std::size_t>(n * row) * sizeof(uint16_t));
    PagedAttentionParams p;
    p.q = d_q.data();
    p.q_token_stride = q_pad != 0 ? q_stride : 0;
    p.out = d_out.data();
    p.num_heads = num_heads;
    p.softmax_scale = 0.3f;
    p.cache = make_paged_kv_view(k.data(), v.data(), KvDtype::fp8_e4m3, num_blocks, kBlock, num_kv_heads, kDim);
    p.batch.num_seqs = p.batch.num_tokens = n;
    p.batch.query_start_loc = static_cast<const int32_t*>(d_starts.data());
    p.batch.context_lens = static_cast<const int32_t*>(d_lens.data());
    p.batch.block_tables = static_cast<const int32_t*>(d_tables.data());
    p.batch.max_blocks_per_seq = num_blocks;
    p.batch.k_scales = static_cast<float*>(k_scales.data());
    p.batch.v_scales = static_cast<float*>(v_scales.data());
    cuda::PagedAttentionCudaLimits limits{n, num_heads, num_kv_heads, kDim, num_blocks * kBlock};
    const std::size_t bytes = test_workspace_bytes(limits, options);
    cuda::DeviceBuffer workspace(bytes);
    cuda::paged_attention_cuda(p, workspace.data(), bytes, nullptr, options);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> last(static_cast<std::size_t>(num_heads) * kDim);
    CUDA_CHECK(cudaMemcpy(last.data(), static_cast<const uint16_t*>(d_out.data()) + int64_t{n - 1} * num_heads * kDim,
                          last.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return last;
  }
};

}  // namespace

TEST_CASE("CUDA decode attention is batch invariant, bitwise", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  // A sequence of 8,000 tokens alone, then behind 40 others of 8,000 (about 330k tokens of
  // decode context: a plan that sized partitions from the batch's total would cut this one
  // differently), then as the last row of a speculative verification (the same blocks at the
  // six previous lengths, in one batch): its output bits are the same each time. Both kernels:
  // CUDA cores (group 1, 4 KV heads) and tensor cores (group 4, 1 KV head); 128 outputs each.
  constexpr int32_t kLen = 8000;
  for (const int32_t kv_heads : {4, 1}) {
    INFO("group " << 4 / kv_heads);
    const SharedContext context(4, kv_heads, kLen, 1234 + static_cast<uint32_t>(kv_heads));
    const std::vector<uint16_t> alone = context.run({kLen});
    std::vector<int32_t> crowd(40, kLen);
    crowd.push_back(kLen);
    CHECK(context.run(crowd) == alone);
    CHECK(context.run({kLen - 6, kLen - 5, kLen - 4, kLen - 3, kLen - 2, kLen - 1, kLen}) == alone);
    // What a different cut would give (partitions of 256 tokens, not decode_partition's 512): on
    // tensor cores, which round each partition's probabilities to f16 against its own running
    // max, the check above can tell. (On CUDA cores a cut only reorders fp32 sums, which the bf16
    // output mostly hides.)
    if (kv_heads == 1) {
      SharedContext cut(4, kv_heads, kLen, 1234 + static_cast<uint32_t>(kv_heads));
      cut.options.partition_tokens = 256;
      CHECK(cut.run({kLen}) != alone);
    }
  }
}

TEST_CASE("CUDA decode attention reads query rows at any alignment alike, bitwise", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  // The kernels load 4 query elements at once from an item whose first element is 8-byte aligned,
  // one at a time otherwise. Two tokens: with a token stride of row + 1 elements the second's row
  // starts 2 bytes past an 8-byte boundary (one at a time), with row + 4 at one (4 at once, as
  // packed rows); its output bits are the same each time. CUDA cores (group 1) and tensor cores
  // (group 4).
  constexpr int32_t kLen = 700;
  for (const int32_t kv_heads : {4, 1}) {
    INFO("group " << 4 / kv_heads);
    SharedContext context(4, kv_heads, kLen, 77 + static_cast<uint32_t>(kv_heads));
    const std::vector<uint16_t> packed = context.run({kLen, kLen});
    for (const int64_t pad : {1, 2, 3, 4}) {
      INFO("q_pad " << pad);
      context.q_pad = pad;
      CHECK(context.run({kLen, kLen}) == packed);
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

TEST_CASE("both decode kernels match the reference at groups 1-16, head_dim 64-256, FP8 and bf16", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  uint32_t seed = 500;
  int turn = 0;
  for (DecodeMath math : {DecodeMath::simt, DecodeMath::mma}) {
    for (int32_t group : {1, 2, 4, 8, 16}) {
      for (int32_t dim : {64, 128, 256}) {
        for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
          CudaAttentionCase c = shaped_case(CaseShape{group, 1, dim, 8 << (turn % 3)}, dtype, decode_seqs({1, 45, 300}),
                                            seed++);
          c.options.decode_math = math;
          c.options.partition_tokens = turn % 2 ? -1 : 64;  // split-K off, and forced
          ++turn;
          check_case(c);
        }
      }
    }
  }
}

TEST_CASE("tensor-core decode: the bf16 window's tail in the same softmax, every MMA order", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  for (int order = 0; order < kMmaOrders; ++order) {
    use_mma_order(order);
    INFO("mma accumulation order " << order);
    for (int32_t block_size : {8, 16, 32}) {
      CudaAttentionCase c = shaped_case(CaseShape{8, 1, 128, block_size}, KvDtype::fp8_e4m3,
                                        decode_seqs({3 * block_size + 5, 2 * block_size + 1, 7, 300}),
                                        600 + static_cast<uint32_t>(block_size + order));
      c.fp8_lens = {2 * block_size, block_size + 1, 0, 300 - 2 * block_size};
      c.tail_ring_blocks = 3;
      c.options.decode_math = DecodeMath::mma;
      check_case(c);
      c.tail_k_only = true;  // K from the tail, V from the FP8 pool with its scale
      check_case(c);
    }
  }
  use_mma_order(0);
}

TEST_CASE("tensor-core decode: queries far outside fp16's range are scaled into it exactly", "[gpu][attention]") {
  if (!have_cuda_device()) return;
  // The f16 Q fragments take q times 2^e: a q of 1e30 would be infinite in f16 without it (and
  // its scores NaN); 1e-30 checks that the exponent's clamp leaves tiny queries finite (their
  // scores are ~0 either way: softmax_scale is fixed by the case, so vanishing would not show).
  for (float magnitude : {1e-30f, 1e30f}) {
    CudaAttentionCase c = shaped_case(CaseShape{4, 1, 128, 16}, KvDtype::fp8_e4m3, decode_seqs({50, 9}), 650);
    c.q_multiplier = magnitude;
    c.options.decode_math = DecodeMath::mma;
    INFO("q x " << magnitude);
    check_case(c);
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
  // Llama-3-8B shapes (GQA 4, head_dim 128) run on tensor cores: ptxas gives the
  // paged_decode_mma_kernel<128, 8> build 128 registers on sm_90a (its __launch_bounds__ asks for
  // 4 CTAs), which lets an SM hold 4 of its 128-thread CTAs (kernels/cuda/kernel_resources.inc;
  // shared memory allows 4 up to ~1,000 sequences).
  const int32_t grid = cuda::paged_attention_cuda_decode_grid(4, 128, 64, sms);
  INFO("decode grid " << grid << " on " << sms << " SMs");
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
  CHECK(grid == 132 * 4);
#else
  CHECK(grid % sms == 0);
#endif
  CHECK(cuda::paged_attention_cuda_decode_grid(1, 64, 64, sms) >= grid);  // fewer registers: at least as many CTAs
}
