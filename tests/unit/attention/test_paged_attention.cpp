// CPU paged attention vs plain double-precision attention over what the pool holds (tight), vs
// the unquantized values (loose), across GQA ratios, head dims, block sizes, contexts 1..4096
// and mixed batches; every instruction-set build; thread-count and batch invariance; contract
// checks.
//
// Tolerances.
// - Tight (kernel vs double attention over the dequantized pool): the same math, so only fp32
//   rounding separates them: dot products of head_dim terms, the exp2 polynomial (< 1e-7
//   relative), the online rescaling and sums over up to 4096 keys. Error relative to the
//   largest |v| being averaged: first-order bound ~ (log2(head_dim) + log2(context)) * 2^-24
//   * |scores| ~ 1e-6; measured <= 1.2e-6 over every case here. Limit kTight = 1e-5.
//   The avx512bf16 build (the default where the CPU has it) rounds q and the probabilities to
//   bf16 before its dot products (K and V stay exact): each score moves by up to
//   2^-9 * sum_i |q_i k_i| (log2 units), each weight by up to 2^-9 relative, so errors of
//   ~1e-3 of max|v| are expected; measured <= 6.1e-3 over every case here. Limit
//   kTightBf16Dot = 1.5e-2: a wrong permutation, pairing or scale is off by O(1).
// - Loose (vs attention over the unquantized K/V): the quantization error itself. Rounding to
//   a format with p mantissa bits leaves a relative error uniform in +-2^-(p+1), RMS
//   2^-(p+1)/sqrt(3) (E4M3, p = 3: 3.6%; bf16, p = 7: 0.23%). The output picks it up twice
//   with about the same weight - through V directly and through the scores (q . dk has
//   RMS ~ 3.6% of the unit-variance scores, which moves the softmax weights by that much) -
//   so the expected relative RMS output error is sqrt(2) * 2^-(p+1)/sqrt(3): 5.1% for FP8,
//   0.32% for bf16 (measured 3.9-4.8% and 0.27-0.33%). Limits: twice that, 10% and 0.64%. A
//   wrong calibration (a scale 16x too large loses 4 bits) or a scale folded wrongly fails it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "attention_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;
using fp8serve::cpu::CpuIsa;
using fp8serve::cpu::ThreadPool;

namespace {

// A mixed batch exercising every path: decode at context 1, short and long decodes (split
// into partitions, up to 4096), a chunk longer than a query tile over a cached context, a
// short chunk whose positions straddle a partition boundary, a prefill from scratch.
std::vector<SeqSpec> mixed_batch(int variant, std::mt19937& rng) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int32_t long_ctx[] = {1024, 2048, 4096, 1500};
  const int32_t chunk = uniform(17, 40);
  const int32_t straddle = uniform(2, 16);
  return {
      {1, 1},
      {uniform(2, 600), 1},
      {chunk + uniform(0, 300), chunk},
      {256 + uniform(1, straddle - 1) + 256 * uniform(1, 3), straddle},
      {long_ctx[variant % 4], 1},
      {33, 33},
  };
}

}  // namespace

TEST_CASE("paged attention matches plain attention over the pool, every shape and ISA", "[attention]") {
  ThreadPool threads(2);
  cpu::AttentionWorkspace workspace;
  int variant = 0;
  for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    for (int32_t group : {1, 3, 4, 8}) {
      for (int32_t head_dim : {64, 128}) {
        for (int32_t block_size : {8, 16, 32}) {
          ++variant;
          const int32_t num_kv_heads = group == 8 ? 1 : 2;
          std::mt19937 rng(1000u + static_cast<unsigned>(variant));
          PoolFixture pool(dtype, block_size, num_kv_heads, head_dim, mixed_batch(variant, rng), rng);
          const std::vector<SeqKv> raw = fill_context(pool, threads, rng);
          std::vector<SeqKv> stored;
          for (int32_t s = 0; s < pool.num_seqs(); ++s) stored.push_back(pool.dequantized(s));
          Run run(pool, num_kv_heads * group, rng);
          const std::vector<double> ref = reference_attention(pool.seqs, stored, num_kv_heads, head_dim,
                                                              run.q, run.num_heads, run.params.softmax_scale);
          const std::vector<double> ref_raw = reference_attention(pool.seqs, raw, num_kv_heads, head_dim,
                                                                  run.q, run.num_heads, run.params.softmax_scale);
          for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16}) {
            if (cpu::resolve_cpu_isa(isa, head_dim) != isa) continue;  // not on this CPU
            INFO("dtype " << kv_dtype_name(dtype) << " group " << group << " head_dim " << head_dim
                          << " block " << block_size << " isa " << cpu::cpu_isa_name(isa));
            std::fill(run.out.begin(), run.out.end(), NAN);
            cpu::paged_attention_cpu(run.params, threads, workspace, isa);
            CHECK(max_scaled_error(pool, stored, run.out, ref, run.num_heads) < tight_limit(isa, head_dim));
            const double loose = dtype == KvDtype::fp8_e4m3 ? kLooseFp8 : kLooseBf16;
            CHECK(relative_rms_error(run.out, ref_raw) < loose);
          }
        }
      }
    }
  }
}

TEST_CASE("paged attention output does not depend on the thread count or the batch", "[attention]") {
  for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    std::mt19937 rng(77);
    ThreadPool one(1), two(2), three(3);
    cpu::AttentionWorkspace workspace;
    PoolFixture pool(dtype, 16, 2, 64, mixed_batch(3, rng), rng);
    fill_context(pool, two, rng);
    Run run(pool, 6, rng);
    cpu::paged_attention_cpu(run.params, one, workspace);
    const std::vector<float> reference = run.out;
    for (ThreadPool* threads : {&two, &three}) {
      std::fill(run.out.begin(), run.out.end(), NAN);
      cpu::paged_attention_cpu(run.params, *threads, workspace);
      CHECK(std::memcmp(run.out.data(), reference.data(), reference.size() * sizeof(float)) == 0);
    }
    // Token strides of 0 mean packed, as in forward_ops.hpp.
    PagedAttentionParams packed = run.params;
    packed.q_token_stride = packed.out_token_stride = 0;
    std::fill(run.out.begin(), run.out.end(), NAN);
    cpu::paged_attention_cpu(packed, two, workspace);
    CHECK(std::memcmp(run.out.data(), reference.data(), reference.size() * sizeof(float)) == 0);
    // Each sequence alone in a batch of one: bit-identical rows (the engine relies on it).
    CHECK(first_sequence_not_alone_invariant(run, pool, nullptr, two, workspace, reference) == -1);
  }
}

TEST_CASE("a prefill row is bitwise its decode within one partition, every ISA and GQA group", "[attention]") {
  // Preemption recomputes a sequence in prefill chunks that its first run computed token by
  // token, and the engine's outputs must not change (test_priority, test_speculative): a row of
  // a long chunk (query tiles of several rows a pass) must give its decode's bits (the group's
  // rows a pass). Within one partition (256 keys) the two run the same key chunks; rows per pass
  // must not change how a row's dot products are summed. The fp32 builds run here on every CPU
  // that has them, so a CPU with AVX512-BF16 (which the engine would use) tests them too.
  ThreadPool threads(2);
  cpu::AttentionWorkspace workspace;
  const int32_t context = 200, chunk = 40;  // chunk > kQueryTile: query tiles, not token by token
  static_assert(chunk > cpu::kQueryTile && context <= cpu::kPartitionTokens);
  for (KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    for (int32_t group : {1, 2, 3, 4, 8}) {
      for (int32_t head_dim : {64, 128}) {
        std::mt19937 rng(900u + static_cast<unsigned>(group * 2 + head_dim));
        const int32_t num_kv_heads = 2;
        PoolFixture pool(dtype, 16, num_kv_heads, head_dim, {{context, chunk}}, rng);
        fill_context(pool, threads, rng);
        Run run(pool, num_kv_heads * group, rng);
        const int64_t row = static_cast<int64_t>(run.num_heads) * head_dim;
        for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16}) {
          if (cpu::resolve_cpu_isa(isa, head_dim) != isa) continue;  // not on this CPU
          INFO("dtype " << kv_dtype_name(dtype) << " group " << group << " head_dim " << head_dim << " isa "
                        << cpu::cpu_isa_name(isa));
          std::fill(run.out.begin(), run.out.end(), NAN);
          cpu::paged_attention_cpu(run.params, threads, workspace, isa);
          int32_t differing = 0;
          for (int32_t t = 0; t < chunk; ++t) {
            const int32_t starts[2] = {0, 1};
            const int32_t context_len = context - chunk + t + 1;
            std::vector<float> out(static_cast<std::size_t>(row), NAN);
            PagedAttentionParams decode = run.params;
            decode.q = run.q.data() + t * row;
            decode.out = out.data();
            decode.batch.num_tokens = 1;
            decode.batch.query_start_loc = starts;
            decode.batch.context_lens = &context_len;
            cpu::paged_attention_cpu(decode, threads, workspace, isa);
            if (std::memcmp(out.data(), run.out.data() + t * row, out.size() * sizeof(float)) != 0) ++differing;
          }
          CHECK(differing == 0);
        }
      }
    }
  }
}

TEST_CASE("chunked prefill then decode, kv_write then attention every step", "[attention]") {
  // The engine's order: a 40-token prompt in chunks of 24 and 16 (the first calibrates, the
  // second uses the frozen scale), then 5 decode steps, one sequence next to another one
  // decoding. Each step is checked against plain attention over the pool.
  std::mt19937 rng(5);
  ThreadPool threads(2);
  cpu::AttentionWorkspace workspace;
  const int32_t num_kv_heads = 2, num_heads = 8, hd = 64;
  PoolFixture pool(KvDtype::fp8_e4m3, 8, num_kv_heads, hd, {{46, 0}, {50, 0}}, rng);
  pool.k_scales[1] = 0.01f;  // sequence 1 started earlier: frozen scales, context written below
  pool.v_scales[1] = 0.01f;
  struct Step {
    int32_t seq0_new, seq1_new;
    bool calibrate0;
  };
  const Step steps[] = {{24, 0, true}, {16, 1, false}, {1, 1, false}, {1, 1, false}, {1, 1, false},
                        {1, 1, false}, {1, 1, false}};
  int32_t len[2] = {0, 44};
  for (int32_t pos = 0; pos < 44; ++pos) {  // sequence 1's cached context, quantized by the test
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      for (int32_t d = 0; d < hd; ++d) {
        pool.k_bytes[pool.k_index(1, pos, h, d)] = fp8_e4m3_encode(static_cast<float>(rng() % 200) / 100.0f - 1.0f);
        pool.v_bytes[pool.v_index(1, pos, h, d)] = fp8_e4m3_encode(static_cast<float>(rng() % 200) / 100.0f - 1.0f);
      }
    }
  }
  for (const Step& step : steps) {
    len[0] += step.seq0_new;
    len[1] += step.seq1_new;
    pool.seqs = {{len[0], step.seq0_new}, {len[1], step.seq1_new}};
    const int32_t n = step.seq0_new + step.seq1_new;
    std::vector<float> k = random_normal(static_cast<std::size_t>(n) * num_kv_heads * hd, rng);
    std::vector<float> v = random_normal(k.size(), rng);
    Run run(pool, num_heads, rng);
    run.arrays.calibrate[0] = step.calibrate0 ? 1 : 0;
    run.params.batch = run.arrays.batch(pool);
    KvWriteParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = w.v_token_stride = num_kv_heads * hd;
    w.cache = pool.view();
    w.batch = run.params.batch;
    const float k_scale_before = pool.k_scales[0];
    cpu::kv_write_cpu(w, threads);
    if (!step.calibrate0) CHECK(pool.k_scales[0] == k_scale_before);
    cpu::paged_attention_cpu(run.params, threads, workspace);
    std::vector<SeqKv> stored{pool.dequantized(0), pool.dequantized(1)};
    const std::vector<double> ref =
        reference_attention(pool.seqs, stored, num_kv_heads, hd, run.q, num_heads, run.params.softmax_scale);
    INFO("context lengths " << len[0] << ", " << len[1]);
    CHECK(max_scaled_error(pool, stored, run.out, ref, num_heads) < tight_limit(CpuIsa::best, hd));
  }
}

TEST_CASE("paged attention rejects a batch that breaks the contract", "[attention]") {
  std::mt19937 rng(9);
  ThreadPool threads(1);
  cpu::AttentionWorkspace workspace;
  PoolFixture pool(KvDtype::fp8_e4m3, 16, 2, 64, {{40, 1}, {20, 3}}, rng);
  Run run(pool, 4, rng);
  cpu::paged_attention_cpu(run.params, threads, workspace);  // the valid batch runs

  SECTION("block id outside the pool") {
    pool.block_tables[1] = pool.num_blocks;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("negative block id") {
    pool.block_tables[0] = -1;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("context shorter than the new tokens") {
    run.arrays.context_lens[1] = 2;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("context longer than the block table") {
    run.arrays.context_lens[0] = pool.max_blocks_per_seq * 16 + 1;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("query starts that do not add up") {
    run.arrays.query_start_loc[2] = 3;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("heads not a multiple of the KV heads") {
    run.params.num_heads = 3;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("zero or NaN scale") {
    pool.k_scales[0] = 0.0f;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
    pool.k_scales[0] = NAN;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("head_dim beyond the kernel's buffers") {
    run.params.cache.head_dim = 512;
    run.params.cache.v_token_stride = 512;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
}
