// The bf16 recent window (kernels/paged_kv.hpp): kv_write's routing between the FP8 pool and
// the tail, kv_spill's move of whole blocks out of the tail, and paged attention over both
// segments, against plain loops and double-precision attention over what the pool and the
// tail hold (the test's own slot arithmetic); every ISA build, head dims 64 and 128, block
// sizes 8/16/32, windows 0 (no tail), 16, 32 and 64, K-and-V and K-only tails, contexts and
// prefill chunks straddling the boundary, split-K partitions across it; bitwise batch and
// thread-count invariance; contract checks.
//
// Tolerances are test_paged_attention.cpp's (its header explains them; attention_test_util.hpp
// holds them): tight against the stored values, loose (FP8's quantization error) against the
// unquantized ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "attention_test_util.hpp"
#include "kernels/cpu/kv_spill_cpu.hpp"

using namespace fp8serve;
using namespace fp8serve::test;
using fp8serve::cpu::CpuIsa;
using fp8serve::cpu::ThreadPool;

namespace {

// fp8_e4m3_encode(bf16(x) / scale): what the window writes into the FP8 pool, either path.
uint8_t fp8_of(float x, float scale) { return fp8_e4m3_encode(bf16_decode(bf16_encode(x)) / scale); }

// Sequences whose contexts and chunks straddle the FP8/tail boundary: a context of 1 (all
// tail), decodes just past a block that left the window and deep in long contexts (split-K
// partitions, one of them across the boundary), a prefill chunk longer than a query tile that
// starts in the FP8 part, a short chunk across a partition boundary, a prefill from scratch.
std::vector<SeqSpec> straddling_batch(int variant, int32_t window, std::mt19937& rng) {
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int32_t long_ctx[] = {1024, 2048, 4096, 1500};
  const int32_t chunk = window + uniform(17, 40);
  const int32_t straddle = uniform(2, 16);
  return {
      {1, 1},
      {window + uniform(1, 40), 1},
      {chunk + uniform(0, 300), chunk},
      {256 + uniform(1, straddle - 1) + 256 * uniform(1, 3), straddle},
      {long_ctx[variant % 4] + uniform(0, 70), 1},
      {257 + window, 3},  // the tail starts just before a partition boundary
      {33, 33},
  };
}

}  // namespace

TEST_CASE("window attention matches plain attention over the FP8 body and the bf16 tail, every ISA", "[attention][window]") {
  ThreadPool threads(2);
  cpu::AttentionWorkspace workspace;
  int variant = 0;
  for (int32_t window : {0, 16, 32, 64}) {
    for (const bool values : {true, false}) {
      if (window == 0 && !values) continue;  // no tail at all
      for (int32_t head_dim : {64, 128}) {
        for (int32_t block_size : {8, 16, 32}) {
          if (window % block_size != 0) continue;
          ++variant;
          const int32_t groups[] = {1, 3, 4, 8};
          const int32_t group = groups[variant % 4];
          const int32_t num_kv_heads = group == 8 ? 1 : 2;
          std::mt19937 rng(2000u + static_cast<unsigned>(variant));
          PoolFixture pool(KvDtype::fp8_e4m3, block_size, num_kv_heads, head_dim,
                           straddling_batch(variant, window, rng), rng);
          std::unique_ptr<TailFixture> tail;
          if (window > 0) {
            tail = std::make_unique<TailFixture>(pool, window, values, rng);
            // A prefix hit that reaches past where the window would start: the tail starts there.
            SeqSpec& chunked = pool.seqs[2];
            tail->fp8_lens[2] = std::max(tail->fp8_lens[2], (chunked.context_len - chunked.num_new) / block_size * block_size);
            tail->fp8_lens[4] = pool.seqs[4].context_len;  // an empty tail: every position in FP8
          }
          const std::vector<SeqKv> raw = fill_context(pool, threads, rng, tail.get());
          std::vector<SeqKv> stored;
          for (int32_t s = 0; s < pool.num_seqs(); ++s) stored.push_back(tail ? tail->stored(pool, s) : pool.dequantized(s));
          Run run(pool, num_kv_heads * group, rng, tail.get());
          const auto ref = reference_attention(pool.seqs, stored, num_kv_heads, head_dim, run.q, run.num_heads,
                                               run.params.softmax_scale);
          const auto ref_raw = reference_attention(pool.seqs, raw, num_kv_heads, head_dim, run.q, run.num_heads,
                                                   run.params.softmax_scale);
          for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16}) {
            if (cpu::resolve_cpu_isa(isa, head_dim) != isa) continue;  // not on this CPU
            INFO("window " << window << (values ? " K+V" : " K only") << " group " << group << " head_dim "
                           << head_dim << " block " << block_size << " isa " << cpu::cpu_isa_name(isa));
            std::fill(run.out.begin(), run.out.end(), NAN);
            cpu::paged_attention_cpu(run.params, threads, workspace, isa);
            CHECK(max_scaled_error(pool, stored, run.out, ref, run.num_heads) < tight_limit(isa, head_dim));
            CHECK(relative_rms_error(run.out, ref_raw) < kLooseFp8);
          }
        }
      }
    }
  }
}

TEST_CASE("a token's FP8 bytes are the same written directly or spilled from the tail", "[kv_write][window]") {
  // Sequence 0 writes its 40 tokens straight into the pool (fp8_len = 40); sequence 1 writes
  // the same values into its tail (fp8_len = 0) and a later step spills them all. Values sit
  // near FP8 rounding boundaries, where quantizing x and quantizing bf16(x) can differ: both
  // paths must give the latter.
  std::mt19937 rng(3);
  ThreadPool threads(2);
  const int32_t nkv = 2, hd = 64, row = nkv * hd, len = 40, block = 8;
  PoolFixture pool(KvDtype::fp8_e4m3, block, nkv, hd, {{len, len}, {len, len}}, rng);
  TailFixture tail(pool, 32, true, rng);  // 5 ring blocks: 40 tokens fit
  tail.fp8_lens = {len, 0};
  pool.k_scales = {0.01f, 0.01f};
  pool.v_scales = {0.02f, 0.02f};
  std::vector<float> half(static_cast<std::size_t>(len) * row), k, v;
  std::uniform_int_distribution<int> code(0x08, 0x76);
  for (float& x : half) {
    // Midway between two neighbouring E4M3 values, nudged by less than a bf16 ulp.
    const uint8_t c = static_cast<uint8_t>(code(rng));
    const float mid = 0.5f * (fp8_e4m3_decode(c) + fp8_e4m3_decode(static_cast<uint8_t>(c + 1)));
    x = mid * (1.0f + std::ldexp(static_cast<float>(rng() % 200) - 100.0f, -16));
  }
  for (int s = 0; s < 2; ++s) {
    for (float x : half) k.push_back(x * 0.01f);
    for (float x : half) v.push_back(-x * 0.02f);
  }
  int differ = 0;
  for (std::size_t i = 0; i < half.size(); ++i) differ += fp8_e4m3_encode(k[i] / 0.01f) != fp8_of(k[i], 0.01f);
  CHECK(differ > 0);  // the values do exercise the double rounding
  BatchArrays arrays(pool);
  KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.cache = pool.view();
  w.tail = tail.view(pool);
  w.batch = arrays.batch(pool);
  tail.attach(w.batch);
  KvWriteCounts counts;
  w.counts = &counts;
  cpu::kv_write_cpu(w, threads);
  CHECK(counts.num_elements == static_cast<uint64_t>(len) * row);  // sequence 0's only
  CHECK(counts.num_v_elements == static_cast<uint64_t>(len) * row);

  // A step with no new tokens in which sequence 1's whole context leaves the window.
  const std::vector<int32_t> starts{0, 0, 0}, lens{len, len}, fp8_after{len, len}, spill_from{len, 0};
  KvSpillParams sp;
  sp.cache = pool.view();
  sp.tail = tail.view(pool);
  sp.batch = w.batch;
  sp.batch.num_tokens = 0;
  sp.batch.query_start_loc = starts.data();
  sp.batch.context_lens = lens.data();
  sp.batch.fp8_lens = fp8_after.data();
  sp.spill_starts = spill_from.data();
  sp.max_spill_tokens = len;
  KvWriteCounts spilled;
  sp.counts = &spilled;
  cpu::kv_spill_cpu(sp, threads);
  CHECK(spilled.num_elements == static_cast<uint64_t>(len) * row);
  for (int32_t pos = 0; pos < len; ++pos) {
    for (int32_t h = 0; h < nkv; ++h) {
      for (int32_t d = 0; d < hd; ++d) {
        const std::size_t i = static_cast<std::size_t>(pos) * row + h * hd + d;
        INFO("position " << pos << " head " << h << " dim " << d);
        REQUIRE(pool.k_bytes[pool.k_index(0, pos, h, d)] == fp8_of(k[i], 0.01f));
        REQUIRE(pool.k_bytes[pool.k_index(1, pos, h, d)] == fp8_of(k[i], 0.01f));
        REQUIRE(pool.v_bytes[pool.v_index(0, pos, h, d)] == fp8_of(v[i], 0.02f));
        REQUIRE(pool.v_bytes[pool.v_index(1, pos, h, d)] == fp8_of(v[i], 0.02f));
      }
    }
  }
}

namespace {

// The engine's rule for where the tail starts (cache/block_manager.hpp), restated.
int32_t window_fp8_len(int32_t context_len, int32_t window, int32_t block) {
  return context_len > window ? (context_len - window) / block * block : 0;
}

}  // namespace

TEST_CASE("prefill chunks and decode steps through the window: spill, kv_write and attention every step", "[attention][window]") {
  // The engine's order per step: kv_spill, kv_write, attention. Sequence 0: a 46-token prompt
  // in chunks of 20 (calibrating: all its tokens go to the tail, all count for the scale) and
  // 26 (straddling: its first tokens go straight to FP8, a spill empties the first chunk's
  // blocks), then 30 decode steps, one of them with a K element 1000x the calibrated amax.
  // Sequence 1 decodes next to it from a 50-token context the test wrote itself. After every
  // step every position holds exactly what the contract says, the counts are those of the
  // positions that reached the FP8 pool, and attention matches the reference over both parts.
  for (const bool values : {true, false}) {
    std::mt19937 rng(values ? 11 : 12);
    ThreadPool threads(2);
    cpu::AttentionWorkspace workspace;
    const int32_t nkv = 2, hd = 64, row = nkv * hd, num_heads = 4, block = 8, window = 16;
    const float margin = 2.0f;
    PoolFixture pool(KvDtype::fp8_e4m3, block, nkv, hd, {{76, 0}, {81, 0}}, rng);
    TailFixture tail(pool, window, values, rng);
    pool.k_scales[1] = 0.01f;
    pool.v_scales[1] = 0.02f;
    std::vector<std::vector<float>> raw_k(2), raw_v(2);  // [seq][pos * row + h * hd + d]
    int32_t len[2] = {0, 50};
    int32_t fp8_len[2] = {0, window_fp8_len(50, window, block)};
    raw_k[1] = random_normal(50 * row, rng, 0.5f);
    raw_v[1] = random_normal(50 * row, rng, 0.5f);
    tail.fp8_lens = {0, fp8_len[1]};
    for (int32_t pos = 0; pos < 50; ++pos) {
      for (int32_t h = 0; h < nkv; ++h) {
        for (int32_t d = 0; d < hd; ++d) {
          const std::size_t i = static_cast<std::size_t>(pos) * row + h * hd + d;
          const uint16_t kb = bf16_encode(raw_k[1][i]), vb = bf16_encode(raw_v[1][i]);
          if (pos < fp8_len[1]) {
            pool.k_bytes[pool.k_index(1, pos, h, d)] = fp8_of(raw_k[1][i], 0.01f);
          } else {
            std::memcpy(&tail.k_bytes[2 * tail.k_index(pool, 1, pos, h, d)], &kb, 2);
          }
          if (pos < fp8_len[1] || !values) {
            pool.v_bytes[pool.v_index(1, pos, h, d)] = fp8_of(raw_v[1][i], 0.02f);
          } else {
            std::memcpy(&tail.v_bytes[2 * tail.v_index(pool, 1, pos, h, d)], &vb, 2);
          }
        }
      }
    }
    std::vector<std::array<int32_t, 2>> steps{{20, 0}, {26, 1}};
    for (int i = 0; i < 30; ++i) steps.push_back({1, 1});
    uint64_t total_k_saturated = 0;
    for (std::size_t step = 0; step < steps.size(); ++step) {
      const int32_t fp8_before[2] = {fp8_len[0], fp8_len[1]};
      for (int s = 0; s < 2; ++s) {
        len[s] += steps[step][s];
        fp8_len[s] = std::max(fp8_len[s], window_fp8_len(len[s], window, block));
      }
      pool.seqs = {{len[0], steps[step][0]}, {len[1], steps[step][1]}};
      tail.fp8_lens = {fp8_len[0], fp8_len[1]};
      std::vector<float> k, v;
      for (int s = 0; s < 2; ++s) {
        std::vector<float> nk = random_normal(static_cast<std::size_t>(steps[step][s]) * row, rng, 0.5f);
        std::vector<float> nv = random_normal(nk.size(), rng, 0.5f);
        if (s == 0 && step == 6) nk[5] = 1000.0f * 3.0f;  // position 50: far beyond the amax
        k.insert(k.end(), nk.begin(), nk.end());
        v.insert(v.end(), nv.begin(), nv.end());
        raw_k[s].insert(raw_k[s].end(), nk.begin(), nk.end());
        raw_v[s].insert(raw_v[s].end(), nv.begin(), nv.end());
      }
      Run run(pool, num_heads, rng, &tail);
      run.arrays.calibrate[0] = step == 0 ? 1 : 0;
      run.params.batch = run.arrays.batch(pool);
      tail.attach(run.params.batch);
      const std::vector<int32_t> spill_starts{fp8_before[0], fp8_before[1]};
      KvSpillParams sp;
      sp.cache = pool.view();
      sp.tail = tail.view(pool);
      sp.batch = run.params.batch;
      sp.spill_starts = spill_starts.data();
      sp.max_spill_tokens = 64;
      KvWriteCounts counts;
      sp.counts = &counts;
      cpu::kv_spill_cpu(sp, threads);
      KvWriteParams w;
      w.k = k.data();
      w.v = v.data();
      w.cache = pool.view();
      w.tail = tail.view(pool);
      w.batch = run.params.batch;
      w.scale_margin = margin;
      w.counts = &counts;
      cpu::kv_write_cpu(w, threads);
      if (step == 0) {  // calibrated on all 20 tokens, though all of them went to the tail
        float amax = 0.0f;
        for (const float x : raw_k[0]) amax = std::max(amax, std::fabs(x));
        CHECK(pool.k_scales[0] == calibrate_kv_scale(amax, margin));
      }
      INFO("step " << step << ", lengths " << len[0] << " and " << len[1] << ", fp8 parts " << fp8_len[0] << " and "
                   << fp8_len[1] << (values ? ", K+V" : ", K only"));
      // Every position holds what the contract says; the counts are those of what reached FP8.
      KvWriteCounts expected;
      for (int32_t s = 0; s < 2; ++s) {
        const float ks = pool.k_scales[s], vs = pool.v_scales[s];
        const int32_t first_new = len[s] - steps[step][s];
        for (int32_t pos = 0; pos < len[s]; ++pos) {
          const bool k_moved = pos < fp8_len[s] && (pos >= first_new || pos >= fp8_before[s]);
          const bool v_moved = values ? k_moved : pos >= first_new;
          expected.num_elements += k_moved ? row : 0;
          expected.num_v_elements += v_moved ? row : 0;
          for (int32_t h = 0; h < nkv; ++h) {
            for (int32_t d = 0; d < hd; ++d) {
              const std::size_t i = static_cast<std::size_t>(pos) * row + h * hd + d;
              const float kx = raw_k[s][i], vx = raw_v[s][i];
              if (pos < fp8_len[s]) {
                REQUIRE(pool.k_bytes[pool.k_index(s, pos, h, d)] == fp8_of(kx, ks));
              } else {
                REQUIRE(TailFixture::bf16_at(tail.k_bytes, tail.k_index(pool, s, pos, h, d)) == bf16_decode(bf16_encode(kx)));
              }
              if (pos < fp8_len[s] || !values) {
                REQUIRE(pool.v_bytes[pool.v_index(s, pos, h, d)] == fp8_of(vx, vs));
              } else {
                REQUIRE(TailFixture::bf16_at(tail.v_bytes, tail.v_index(pool, s, pos, h, d)) == bf16_decode(bf16_encode(vx)));
              }
              if (k_moved) expected.num_k_saturated += kv_value_saturates(bf16_decode(bf16_encode(kx)) / ks);
              if (v_moved) expected.num_v_saturated += kv_value_saturates(bf16_decode(bf16_encode(vx)) / vs);
            }
          }
        }
      }
      CHECK(counts == expected);
      total_k_saturated += counts.num_k_saturated;

      cpu::paged_attention_cpu(run.params, threads, workspace);
      std::vector<SeqKv> stored{tail.stored(pool, 0), tail.stored(pool, 1)};
      const auto ref = reference_attention(pool.seqs, stored, nkv, hd, run.q, num_heads, run.params.softmax_scale);
      CHECK(max_scaled_error(pool, stored, run.out, ref, num_heads) < tight_limit(CpuIsa::best, hd));
    }
    CHECK(total_k_saturated == 1);  // the big element, counted once: when its block left the tail
  }
}

TEST_CASE("window attention is bitwise the same alone and in a batch, on any thread count", "[attention][window]") {
  for (const bool values : {true, false}) {
    std::mt19937 rng(values ? 77 : 78);
    ThreadPool one(1), two(2), three(3);
    cpu::AttentionWorkspace workspace;
    PoolFixture pool(KvDtype::fp8_e4m3, 16, 2, 64, straddling_batch(3, 32, rng), rng);
    TailFixture tail(pool, 32, values, rng);
    fill_context(pool, two, rng, &tail);
    Run run(pool, 6, rng, &tail);
    cpu::paged_attention_cpu(run.params, one, workspace);
    const std::vector<float> reference = run.out;
    for (ThreadPool* threads : {&two, &three}) {
      std::fill(run.out.begin(), run.out.end(), NAN);
      cpu::paged_attention_cpu(run.params, *threads, workspace);
      CHECK(std::memcmp(run.out.data(), reference.data(), reference.size() * sizeof(float)) == 0);
    }
    CHECK(first_sequence_not_alone_invariant(run, pool, &tail, two, workspace, reference) == -1);
  }
}

TEST_CASE("the window's kernels reject fields that break the contract", "[attention][window]") {
  std::mt19937 rng(9);
  ThreadPool threads(1);
  cpu::AttentionWorkspace workspace;
  // Window 32, blocks of 16: rings of 3 blocks. Sequence 1 goes from 63 to 66 tokens: its
  // FP8 part from 16 to 32 tokens, so it spills [16, 32).
  PoolFixture pool(KvDtype::fp8_e4m3, 16, 2, 64, {{40, 1}, {66, 3}}, rng);
  TailFixture tail(pool, 32, true, rng);
  Run run(pool, 4, rng, &tail);
  cpu::paged_attention_cpu(run.params, threads, workspace);  // the valid batch runs
  const std::vector<int32_t> spill_starts{0, 16};
  KvSpillParams sp;
  sp.cache = pool.view();
  sp.tail = tail.view(pool);
  sp.batch = run.params.batch;
  sp.spill_starts = spill_starts.data();
  sp.max_spill_tokens = 16;
  cpu::kv_spill_cpu(sp, threads);  // sequence 1 spills [16, 32): valid

  SECTION("a ring outside the tail pool") {
    tail.rings[1] = tail.num_rings;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
    CHECK_THROWS_AS(cpu::kv_spill_cpu(sp, threads), std::invalid_argument);
  }
  SECTION("fp8_len beyond the context") {
    tail.fp8_lens[0] = 41;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("a tail longer than its ring") {
    tail.fp8_lens[1] = 16;  // 50 tokens in a ring of 3 x 16
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("a spill from positions the ring no longer holds") {
    const std::vector<int32_t> too_early{0, 0};  // the ring held [15, 63) of the 63 tokens
    sp.spill_starts = too_early.data();
    CHECK_THROWS_AS(cpu::kv_spill_cpu(sp, threads), std::invalid_argument);
  }
  SECTION("a spill longer than max_spill_tokens") {
    sp.max_spill_tokens = 15;
    CHECK_THROWS_AS(cpu::kv_spill_cpu(sp, threads), std::invalid_argument);
  }
  SECTION("a tail pool of another geometry or dtype") {
    PagedKvView other = tail.view(pool);
    other.block_size = 8;
    run.params.tail = other;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
    other = tail.view(pool);
    other.dtype = KvDtype::fp8_e4m3;
    run.params.tail = other;
    CHECK_THROWS_AS(cpu::paged_attention_cpu(run.params, threads, workspace), std::invalid_argument);
  }
  SECTION("a window over a bf16 main pool") {
    PoolFixture bf16(KvDtype::bf16, 16, 2, 64, {{40, 1}, {66, 3}}, rng);
    Run other(bf16, 4, rng, &tail);
    CHECK_THROWS_AS(cpu::paged_attention_cpu(other.params, threads, workspace), std::invalid_argument);
  }
  SECTION("kv_spill without the window's fields") {
    sp.batch.fp8_lens = nullptr;
    CHECK_THROWS_AS(cpu::kv_spill_cpu(sp, threads), std::invalid_argument);
  }
}
