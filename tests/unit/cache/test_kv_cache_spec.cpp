// Pool sizing from a byte budget, the KvDtype helpers, scale calibration and saturation
// accounting: checked against the formulas of docs/design.md, "The FP8 KV contract", written out by hand.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cache/kv_cache_spec.hpp"
#include "cache/kv_scales.hpp"
#include "kernels/kv_dtype.hpp"

using fp8serve::KvCacheSpec;
using fp8serve::KvDtype;

TEST_CASE("bytes per block and blocks per budget follow the formula", "[cache][spec]") {
  // SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64.
  KvCacheSpec spec{16, 30, 3, 64, KvDtype::fp8_e4m3};
  REQUIRE_NOTHROW(spec.validate());
  CHECK(spec.bytes_per_token() == 30u * 2u * 3u * 64u * 1u);
  CHECK(spec.bytes_per_block() == 16u * 30u * 2u * 3u * 64u);
  const uint64_t budget = 256ull << 20;
  CHECK(spec.num_blocks_for_budget(budget) == static_cast<int>(budget / (16u * 30u * 2u * 3u * 64u)));
  CHECK(spec.num_blocks_for_budget(spec.bytes_per_block() - 1) == 0);
  CHECK(spec.num_blocks_for_budget(spec.bytes_per_block() * 7 + 5) == 7);

  KvCacheSpec bf16 = spec;
  bf16.dtype = KvDtype::bf16;
  // FP8 is exactly half of bf16 per token, so the same budget holds twice the blocks.
  CHECK(bf16.bytes_per_token() == 2 * spec.bytes_per_token());
  CHECK(bf16.bytes_per_block() == 2 * spec.bytes_per_block());
  CHECK(spec.num_blocks_for_budget(budget) == 2 * bf16.num_blocks_for_budget(budget));

  // 10 * 184320 bytes = 1.76 MiB
  CHECK(spec.describe(10) == "10 blocks x 16 tokens = 160 tokens, 1.8 MiB, fp8_e4m3");
}

TEST_CASE("the bf16 window's tail pool: rings of window / block + 1 bf16 blocks per running sequence", "[cache][spec][window]") {
  KvCacheSpec spec{16, 30, 3, 64, KvDtype::fp8_e4m3};
  CHECK(spec.tail_bytes(64) == 0);
  CHECK(spec.describe_tail(64) == "bf16 window off");
  spec.window = fp8serve::KvWindow{32, true, 16};
  REQUIRE_NOTHROW(spec.validate());
  // K and V, bf16: twice an FP8 token; 3 blocks of 16 per ring.
  CHECK(spec.tail_bytes_per_token() == 30u * 2u * 3u * 64u * 2u);
  CHECK(spec.tail_bytes(64) == 64u * 3u * 16u * 30u * 2u * 3u * 64u * 2u);
  CHECK(spec.describe_tail(64) == "bf16 window 32 tokens (K+V): 64 rings x 3 blocks, 67.5 MiB, 23040 bytes/token");
  spec.window.values = false;  // K only: half
  CHECK(spec.tail_bytes(64) == 64u * 3u * 16u * 30u * 3u * 64u * 2u);
  spec.window.tokens = 24;
  CHECK_THROWS_AS(spec.validate(), std::invalid_argument);
  spec.window.tokens = 32;
  spec.dtype = KvDtype::bf16;
  CHECK_THROWS_AS(spec.validate(), std::invalid_argument);  // a bf16 pool needs no window
}

TEST_CASE("block count is capped so every slot id fits in int32", "[cache][spec]") {
  const KvCacheSpec spec{32, 1, 1, 1, KvDtype::fp8_e4m3};
  const int num_blocks = spec.num_blocks_for_budget(std::numeric_limits<uint64_t>::max());
  CHECK(static_cast<int64_t>(num_blocks) * spec.block_size <= std::numeric_limits<int32_t>::max());
  CHECK(static_cast<int64_t>(num_blocks + 1) * spec.block_size > std::numeric_limits<int32_t>::max());
}

TEST_CASE("invalid specs are rejected with a message", "[cache][spec]") {
  CHECK_THROWS_AS((KvCacheSpec{0, 30, 3, 64, KvDtype::bf16}.validate()), std::invalid_argument);
  CHECK_THROWS_AS((KvCacheSpec{16, -1, 3, 64, KvDtype::bf16}.validate()), std::invalid_argument);
  CHECK_THROWS_AS((KvCacheSpec{16, 30, 0, 64, KvDtype::bf16}.validate()), std::invalid_argument);
  CHECK_THROWS_AS((KvCacheSpec{16, 30, 3, 1 << 20, KvDtype::bf16}.validate()), std::invalid_argument);
  CHECK_THROWS_AS((KvCacheSpec{16, 30, 3, 64, static_cast<KvDtype>(9)}.validate()), std::invalid_argument);
}

TEST_CASE("KvDtype names round-trip and sizes are 1 and 2 bytes", "[cache][spec]") {
  for (const KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    CHECK(fp8serve::parse_kv_dtype(fp8serve::kv_dtype_name(dtype)) == dtype);
  }
  CHECK_FALSE(fp8serve::parse_kv_dtype("fp8").has_value());
  CHECK_FALSE(fp8serve::parse_kv_dtype("").has_value());
  CHECK(fp8serve::kv_dtype_size(KvDtype::fp8_e4m3) == 1);
  CHECK(fp8serve::kv_dtype_size(KvDtype::bf16) == 2);
  CHECK(fp8serve::kv_dtype_is_scaled(KvDtype::fp8_e4m3));
  CHECK_FALSE(fp8serve::kv_dtype_is_scaled(KvDtype::bf16));
}

TEST_CASE("calibrate_kv_scale = max(amax * margin / 448, FLT_MIN)", "[cache][scales]") {
  using fp8serve::calibrate_kv_scale;
  CHECK(calibrate_kv_scale(448.0f, 1.0f) == 1.0f);
  CHECK(calibrate_kv_scale(3.5f, 1.0f) == 3.5f / 448.0f);
  CHECK(calibrate_kv_scale(3.5f, 2.0f) == 3.5f * 2.0f / 448.0f);
  CHECK(calibrate_kv_scale(0.0f, 1.0f) == FLT_MIN);  // all-zero prefill: never a zero scale
  CHECK(calibrate_kv_scale(1e-40f, 1.0f) == FLT_MIN);
  CHECK(calibrate_kv_scale(std::nanf(""), 1.0f) == FLT_MIN);
  CHECK(calibrate_kv_scale(std::numeric_limits<float>::infinity(), 1.0f) == FLT_MAX);
  CHECK(std::isfinite(calibrate_kv_scale(FLT_MAX, 4.0f)));
  // With margin 1 the calibration amax maps exactly onto the FP8 maximum; larger values saturate.
  const float scale = calibrate_kv_scale(10.0f, 1.0f);
  CHECK(fp8serve::fp8_e4m3_encode(10.0f / scale) == 0x7e);
  CHECK_FALSE(fp8serve::kv_value_saturates(10.0f / scale));
  CHECK(fp8serve::kv_value_saturates(10.5f / scale));
  CHECK(fp8serve::kv_value_saturates(-10.5f / scale));
  CHECK_FALSE(fp8serve::kv_value_saturates(std::nanf("")));
  CHECK_NOTHROW(fp8serve::validate_kv_scale_margin(1.0f));
  CHECK_THROWS_AS(fp8serve::validate_kv_scale_margin(0.0f), std::invalid_argument);
  CHECK_THROWS_AS(fp8serve::validate_kv_scale_margin(-1.0f), std::invalid_argument);
  CHECK_THROWS_AS(fp8serve::validate_kv_scale_margin(std::nanf("")), std::invalid_argument);
  CHECK_THROWS_AS(fp8serve::validate_kv_scale_margin(std::numeric_limits<float>::infinity()), std::invalid_argument);
}

TEST_CASE("saturation counters accumulate per layer", "[cache][scales]") {
  fp8serve::KvSaturationCounters counters(3);
  counters.add(0, {100, 1, 0});
  counters.add(2, {100, 4, 7});
  counters.add(2, {50, 1, 0});
  CHECK(counters.layer(0) == fp8serve::KvWriteCounts{100, 1, 0});
  CHECK(counters.layer(1) == fp8serve::KvWriteCounts{});
  CHECK(counters.layer(2) == fp8serve::KvWriteCounts{150, 5, 7});
  CHECK(counters.total() == fp8serve::KvWriteCounts{250, 6, 7});
  CHECK_THROWS_AS(counters.add(counters.num_layers(), {1, 0, 0}), std::out_of_range);
  CHECK_THROWS_AS(counters.layer(-1), std::out_of_range);
  CHECK_THROWS_AS(fp8serve::KvSaturationCounters(0), std::invalid_argument);
}

TEST_CASE("a KV budget split: the rings take at most their share, the pool the rest", "[cache][spec][window]") {
  // SmolLM2-135M's geometry: 30 layers, 3 KV heads, head_dim 64; window 64 tokens, K only: a
  // ring of 5 blocks x 16 tokens x 5760 bytes = 921600; an FP8 block 184320 bytes.
  KvCacheSpec spec;
  spec.num_layers = 30;
  spec.num_kv_heads = 3;
  spec.head_dim = 64;
  spec.window = fp8serve::KvWindow{64, false, 16};
  REQUIRE(spec.tail_bytes(1) == 921600);
  const auto split = [&](uint64_t budget, int max_rings, double share) { return spec.split_budget(budget, max_rings, share); };
  auto s = split(8ull << 20, 64, 0.125);  // 1 MiB for rings: one
  CHECK(s.num_rings == 1);
  CHECK(s.window.enabled());
  CHECK(s.num_blocks == static_cast<int>(((8ull << 20) - 921600) / 184320));
  CHECK(split(64ull << 20, 64, 0.125).num_rings == 9);
  CHECK(split(1ull << 30, 64, 0.125).num_rings == 64);  // capped by --max-num-seqs: 5.5% of the budget
  CHECK(split(1ull << 30, 4, 0.125).num_rings == 4);
  s = split(4ull << 20, 64, 0.125);  // 0.5 MiB: no ring fits - no window, the pool takes it all
  CHECK(s.num_rings == 0);
  CHECK_FALSE(s.window.enabled());
  CHECK(s.num_blocks == static_cast<int>((4ull << 20) / 184320));
  CHECK(split(100000, 64, 0.125).num_blocks == 0);  // not one block: the engine refuses it
  spec.window = fp8serve::KvWindow{};
  s = split(8ull << 20, 64, 0.125);  // no window asked: nothing for rings
  CHECK(s.num_rings == 0);
  CHECK(s.num_blocks == static_cast<int>((8ull << 20) / 184320));
}
