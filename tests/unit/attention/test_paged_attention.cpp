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
#include "kernels/cpu/kv_write_cpu.hpp"
#include "kernels/cpu/paged_attention_cpu.hpp"

using namespace fp8serve;
using namespace fp8serve::test;
using fp8serve::cpu::CpuIsa;
using fp8serve::cpu::ThreadPool;

namespace {

constexpr double kTight = 1e-5;
constexpr double kTightBf16Dot = 1.5e-2;

// The tight limit for the build `isa` resolves to on this CPU.
double tight_limit(CpuIsa isa, int32_t head_dim) {
  return cpu::resolve_cpu_isa(isa, head_dim) == CpuIsa::avx512bf16 ? kTightBf16Dot : kTight;
}
constexpr double kLooseFp8 = 0.10;
constexpr double kLooseBf16 = 0.0064;

// Writes every sequence's whole context through kv_write as one calibrating chunk, so the
// pool holds exactly what the kernel would have written. Keys get a few large channels (as
// real keys do) so the scale is set by outliers. Returns the unquantized values.
std::vector<SeqKv> fill_context(PoolFixture& pool, ThreadPool& threads, std::mt19937& rng) {
  const int32_t row = pool.num_kv_heads * pool.head_dim;
  std::vector<int32_t> starts{0}, lens;
  std::vector<int64_t> slots;
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const int32_t len = pool.seqs[static_cast<std::size_t>(s)].context_len;
    starts.push_back(starts.back() + len);
    lens.push_back(len);
    for (int32_t p = 0; p < len; ++p) slots.push_back(pool.slot(s, p));
  }
  const std::size_t n = static_cast<std::size_t>(starts.back()) * row;
  std::vector<float> k = random_normal(n, rng), v = random_normal(n, rng);
  for (std::size_t i = 0; i < n; i += static_cast<std::size_t>(pool.head_dim)) k[i + 3] *= 6.0f;
  std::vector<uint8_t> calibrate(pool.seqs.size(), 1);
  KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.k_token_stride = w.v_token_stride = row;
  w.cache = pool.view();
  w.batch.num_seqs = pool.num_seqs();
  w.batch.num_tokens = starts.back();
  w.batch.query_start_loc = starts.data();
  w.batch.context_lens = lens.data();
  w.batch.block_tables = pool.block_tables.data();
  w.batch.max_blocks_per_seq = pool.max_blocks_per_seq;
  w.batch.slot_mapping = slots.data();
  w.batch.k_scales = pool.k_scales.data();
  w.batch.v_scales = pool.v_scales.data();
  w.batch.calibrate = calibrate.data();
  cpu::kv_write_cpu(w, threads);
  std::vector<SeqKv> raw(pool.seqs.size());
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const std::size_t first = static_cast<std::size_t>(starts[s]) * row;
    const std::size_t last = static_cast<std::size_t>(starts[s + 1]) * row;
    raw[s].k.assign(k.begin() + first, k.begin() + last);
    raw[s].v.assign(v.begin() + first, v.begin() + last);
  }
  return raw;
}

struct Run {
  std::vector<float> q, out;
  int32_t num_heads;
  BatchArrays arrays;
  PagedAttentionParams params;

  Run(PoolFixture& pool, int32_t num_heads_, std::mt19937& rng)
      : num_heads(num_heads_), arrays(pool) {
    const std::size_t n = static_cast<std::size_t>(arrays.query_start_loc.back()) * num_heads * pool.head_dim;
    q = random_normal(n, rng, 1.5f);
    out.assign(n, NAN);
    params.q = q.data();
    params.out = out.data();
    params.q_token_stride = params.out_token_stride = static_cast<int64_t>(num_heads) * pool.head_dim;
    params.num_heads = num_heads;
    params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(pool.head_dim));
    params.cache = pool.view();
    params.batch = arrays.batch(pool);
  }
};

// max over elements of |out - ref| / max|v of that sequence and kv head|: errors measured
// against the size of the values being averaged.
double max_scaled_error(const PoolFixture& pool, const std::vector<SeqKv>& kv, const std::vector<float>& out,
                        const std::vector<double>& ref, int32_t num_heads) {
  const int32_t hd = pool.head_dim, group = num_heads / pool.num_kv_heads;
  double worst = 0.0;
  int64_t token = 0;
  for (std::size_t s = 0; s < pool.seqs.size(); ++s) {
    for (int32_t i = 0; i < pool.seqs[s].num_new; ++i, ++token) {
      for (int32_t h = 0; h < num_heads; ++h) {
        double vmax = 1e-30;
        for (int32_t j = 0; j < pool.seqs[s].context_len; ++j) {
          for (int32_t d = 0; d < hd; ++d) {
            vmax = std::max(vmax, std::fabs(kv[s].v[(static_cast<std::size_t>(j) * pool.num_kv_heads + h / group) * hd + d]));
          }
        }
        for (int32_t d = 0; d < hd; ++d) {
          const std::size_t e = (static_cast<std::size_t>(token) * num_heads + h) * hd + d;
          const double err = std::fabs(static_cast<double>(out[e]) - ref[e]) / vmax;
          if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
        }
      }
    }
  }
  return worst;
}

// sqrt(sum (out - ref)^2 / sum ref^2).
double relative_rms_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

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
    const int64_t row = static_cast<int64_t>(run.num_heads) * pool.head_dim;
    for (int32_t s = 0; s < pool.num_seqs(); ++s) {
      const int32_t first = run.arrays.query_start_loc[s];
      const int32_t count = pool.seqs[static_cast<std::size_t>(s)].num_new;
      const int32_t starts[2] = {0, count};
      std::vector<float> out(static_cast<std::size_t>(count * row), NAN);
      PagedAttentionParams alone = run.params;
      alone.q = run.q.data() + first * row;
      alone.out = out.data();
      alone.batch.num_seqs = 1;
      alone.batch.num_tokens = count;
      alone.batch.query_start_loc = starts;
      alone.batch.context_lens = run.arrays.context_lens.data() + s;
      alone.batch.block_tables = pool.block_tables.data() + static_cast<int64_t>(s) * pool.max_blocks_per_seq;
      alone.batch.k_scales = pool.k_scales.data() + s;
      alone.batch.v_scales = pool.v_scales.data() + s;
      cpu::paged_attention_cpu(alone, two, workspace);
      INFO("sequence " << s);
      CHECK(std::memcmp(out.data(), reference.data() + first * row, out.size() * sizeof(float)) == 0);
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
