// Scenario tests of the block manager: each states the exact expected tables, slots, hits,
// copies and evictions worked out by hand, and check_integrity() runs after every operation.
#include <catch2/catch.hpp>

#include <map>
#include <numeric>
#include <span>
#include <vector>

#include "cache/block_manager.hpp"

using fp8serve::AllocateResult;
using fp8serve::AppendResult;
using fp8serve::BlockManager;
using fp8serve::BlockManagerOptions;

namespace {

// The block manager keeps no tokens: their owner (the scheduler) passes them where the prefix
// cache keys blocks. Here the test owns them, through the token-taking calls of the old interface.
class Manager : public BlockManager {
 public:
  using BlockManager::BlockManager;
  AllocateResult allocate(fp8serve::SeqId id, std::span<const int32_t> prompt, int max_cached = fp8serve::kNoCap, int group = 1) {
    const AllocateResult result = BlockManager::allocate(id, prompt, max_cached, group);
    tokens_[id].assign(prompt.begin(), prompt.end());
    return result;
  }
  AppendResult append_slot(fp8serve::SeqId id, int32_t token) {
    const AppendResult result = BlockManager::append_slot(id);
    tokens_[id].push_back(token);
    return result;
  }
  void mark_computed(fp8serve::SeqId id, int num_computed, int fp8_floor = 0) {
    BlockManager::mark_computed(id, tokens(id), num_computed, fp8_floor);
  }
  void fork(fp8serve::SeqId parent, fp8serve::SeqId child) {
    BlockManager::fork(parent, child);
    tokens_[child] = tokens_.at(parent);
  }
  void free(fp8serve::SeqId id) {
    BlockManager::free(id);
    tokens_.erase(id);
  }
  void check_integrity() const {
    BlockManager::check_integrity([this](fp8serve::SeqId id) { return tokens(id); });
  }

 private:
  std::span<const int32_t> tokens(fp8serve::SeqId id) const {
    const auto it = tokens_.find(id);
    return it == tokens_.end() ? std::span<const int32_t>{} : std::span<const int32_t>(it->second);
  }
  std::map<fp8serve::SeqId, std::vector<int32_t>> tokens_;
};

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> table_of(const BlockManager& m, fp8serve::SeqId id) {
  const auto t = m.block_table(id);
  return {t.begin(), t.end()};
}

// What kv_write does on the first chunk: store calibrated scales, then the engine commits.
void calibrate_and_commit(Manager& m, fp8serve::SeqId id, float k, float v, int num_computed) {
  fp8serve::KvScales* scales = m.scales_to_calibrate(id);
  REQUIRE(scales != nullptr);
  for (int l = 0; l < m.num_layers(); ++l) {
    scales->k[static_cast<std::size_t>(l)] = k * static_cast<float>(l + 1);
    scales->v[static_cast<std::size_t>(l)] = v * static_cast<float>(l + 1);
  }
  m.mark_computed(id, num_computed);
  m.check_integrity();
}

}  // namespace

TEST_CASE("allocate maps a prompt onto ceil(n / block_size) blocks and slots follow the table", "[cache]") {
  Manager m({4, 2, 8, false});
  m.check_integrity();
  const auto prompt = iota_tokens(10);
  REQUIRE(m.can_allocate(prompt));
  CHECK(m.allocate(1, prompt).num_cached_tokens == 0);
  m.check_integrity();
  CHECK(table_of(m, 1) == std::vector<int32_t>{0, 1, 2});
  CHECK(m.num_free_blocks() == 5);
  CHECK(m.slot(1, 0) == 0);
  CHECK(m.slot(1, 5) == 1 * 4 + 1);
  CHECK(m.slot(1, 9) == 2 * 4 + 1);
  CHECK_THROWS_AS(m.slot(1, 10), std::logic_error);

  calibrate_and_commit(m, 1, 0.5f, 0.25f, 10);
  // Positions 10, 11 fill block 2; 12 needs a new block.
  CHECK(m.append_slot(1, 7).slot == 2 * 4 + 2);
  CHECK(m.append_slot(1, 8).slot == 2 * 4 + 3);
  const AppendResult r = m.append_slot(1, 9);
  m.check_integrity();
  CHECK(r.slot == 3 * 4 + 0);
  CHECK_FALSE(r.copy.has_value());
  CHECK(m.num_tokens(1) == 13);
  CHECK(m.num_free_blocks() == 4);
  m.free(1);
  m.check_integrity();
  CHECK(m.num_free_blocks() == 8);
  CHECK_FALSE(m.contains(1));
}

TEST_CASE("exhaustion: can_allocate and can_append say no exactly when blocks run out", "[cache]") {
  Manager m({4, 1, 3, false});
  CHECK_FALSE(m.can_allocate(iota_tokens(13)));  // 4 blocks
  CHECK_FALSE(m.can_allocate({}));
  REQUIRE(m.can_allocate(iota_tokens(12)));      // exactly 3 blocks
  m.allocate(1, iota_tokens(12));
  calibrate_and_commit(m, 1, 1.0f, 1.0f, 12);
  CHECK(m.num_free_blocks() == 0);
  CHECK_FALSE(m.can_append(1));
  CHECK_THROWS_AS(m.append_slot(1, 5), std::logic_error);
  CHECK_FALSE(m.can_allocate(iota_tokens(1)));
  CHECK_THROWS_AS(m.allocate(2, iota_tokens(1)), std::logic_error);
  m.check_integrity();  // failed calls changed nothing
  m.free(1);
  CHECK(m.can_allocate(iota_tokens(12)));
  m.check_integrity();
}

TEST_CASE("fork shares blocks; the next append copies the shared partial block", "[cache]") {
  Manager m({4, 2, 8, false});
  m.allocate(1, iota_tokens(6));  // blocks 0 (full) and 1 (2 of 4)
  CHECK_THROWS_AS(m.fork(1, 2), std::logic_error);  // not computed yet
  calibrate_and_commit(m, 1, 2.0f, 3.0f, 6);
  m.fork(1, 2);
  m.check_integrity();
  CHECK(table_of(m, 2) == table_of(m, 1));
  CHECK(m.pool().ref_count(0) == 2);
  CHECK(m.pool().ref_count(1) == 2);
  CHECK(m.scales(2) == m.scales(1));
  CHECK(m.scales_to_calibrate(2) == nullptr);  // inherits the frozen scales

  const AppendResult parent = m.append_slot(1, 50);
  m.check_integrity();
  REQUIRE(parent.copy.has_value());
  CHECK(parent.copy->src == 1);
  CHECK(parent.copy->dst == 2);
  CHECK(parent.slot == 2 * 4 + 2);
  CHECK(table_of(m, 1) == std::vector<int32_t>{0, 2});
  CHECK(table_of(m, 2) == std::vector<int32_t>{0, 1});
  // The child is now the only holder of block 1: it writes in place, no copy.
  const AppendResult child = m.append_slot(2, 60);
  CHECK_FALSE(child.copy.has_value());
  CHECK(child.slot == 1 * 4 + 2);
  m.check_integrity();
  CHECK_THROWS_AS(m.fork(1, 3), std::logic_error);  // token 6 not computed yet
  m.mark_computed(1, 7);
  m.mark_computed(2, 7);
  m.free(1);
  m.check_integrity();
  CHECK(m.pool().ref_count(0) == 1);
  m.free(2);
  m.check_integrity();
  CHECK(m.num_free_blocks() == 8);
}

TEST_CASE("fork at a block boundary needs no copy", "[cache]") {
  Manager m({4, 1, 8, false});
  m.allocate(1, iota_tokens(8));
  calibrate_and_commit(m, 1, 1.0f, 1.0f, 8);
  m.fork(1, 2);
  const AppendResult a = m.append_slot(1, 1);
  const AppendResult b = m.append_slot(2, 2);
  m.check_integrity();
  CHECK_FALSE(a.copy.has_value());
  CHECK_FALSE(b.copy.has_value());
  CHECK(a.slot != b.slot);
}

TEST_CASE("prefix hits map the longest cached chain and inherit its scales", "[cache][prefix]") {
  Manager m({4, 3, 16, true});
  const auto prompt = iota_tokens(11);  // 2 full blocks + 3 tokens
  CHECK(m.allocate(1, prompt).num_cached_tokens == 0);
  CHECK(m.scales_to_calibrate(1) != nullptr);
  // Only committed blocks are cached: a second request before the step sees no hit.
  CHECK(m.allocate(2, prompt).num_cached_tokens == 0);
  m.free(2);
  calibrate_and_commit(m, 1, 0.125f, 0.5f, 11);
  const fp8serve::KvScales first_scales = m.scales(1);
  CHECK(first_scales.frozen);
  CHECK(first_scales.k[2] == 0.375f);

  // Same prompt again: both full blocks hit (16 would be all; the last partial block is new).
  const AllocateResult hit = m.allocate(3, prompt);
  m.check_integrity();
  CHECK(hit.num_cached_tokens == 8);
  CHECK(m.num_computed_tokens(3) == 8);
  CHECK(table_of(m, 3)[0] == table_of(m, 1)[0]);
  CHECK(table_of(m, 3)[1] == table_of(m, 1)[1]);
  CHECK(table_of(m, 3)[2] != table_of(m, 1)[2]);
  CHECK(m.scales(3) == first_scales);
  CHECK(m.scales_to_calibrate(3) == nullptr);  // never recalibrated

  // A prompt that diverges inside block 1 hits only block 0.
  auto other = prompt;
  other[5] = 9999;
  CHECK(m.allocate(4, other).num_cached_tokens == 4);
  m.check_integrity();
  // A prompt of exactly two blocks: the block holding the last token is recomputed.
  CHECK(m.allocate(5, iota_tokens(8)).num_cached_tokens == 4);
  // Same block contents at another position do not hit (the key chains the prefix).
  auto shifted = iota_tokens(4, 104);
  shifted.insert(shifted.end(), {1, 2, 3});
  CHECK(m.allocate(6, shifted).num_cached_tokens == 0);
  m.check_integrity();
  const auto stats = m.prefix_cache_stats();
  CHECK(stats.num_hit_tokens == 8 + 4 + 4);
  CHECK(stats.num_queried_tokens == 11 * 4 + 8 + 7);
}

TEST_CASE("finished sequences stay cached and are evicted LRU, tail blocks first", "[cache][prefix]") {
  Manager m({2, 1, 6, true});
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};   // blocks a0 a1 + partial
  const std::vector<int32_t> b = {7, 8, 9, 10, 11};
  m.allocate(1, a);
  calibrate_and_commit(m, 1, 1.0f, 1.0f, 5);
  m.allocate(2, b);
  calibrate_and_commit(m, 2, 2.0f, 2.0f, 5);
  const auto ta = table_of(m, 1), tb = table_of(m, 2);
  m.free(1);
  m.free(2);
  m.check_integrity();
  CHECK(m.num_free_blocks() == 6);
  CHECK(m.pool().num_idle_cached_blocks() == 4);  // partial blocks went to the free list

  // 3 blocks needed, 2 free: the LRU idle block goes, which is a's tail (freed first).
  const std::vector<int32_t> c = {20, 21, 22, 23, 24, 25};
  m.allocate(3, c);
  m.check_integrity();
  CHECK(m.pool().num_evictions() == 1);
  CHECK_FALSE(m.pool().is_cached(ta[1]));
  CHECK(m.pool().is_cached(ta[0]));
  // Now LRU = [a0, b0, b1], free list empty. b would hit b0 and b1 and need one new block:
  // 3 allocatable minus the 2 idle hits it revives leaves 1, enough.
  CHECK(m.num_free_blocks() == 3);
  CHECK(m.can_allocate(b));
  CHECK(m.allocate(5, b).num_cached_tokens == 4);
  m.check_integrity();
  CHECK(table_of(m, 5)[0] == tb[0]);
  CHECK(table_of(m, 5)[1] == tb[1]);
  CHECK(m.pool().num_evictions() == 2);  // the new block evicted a0, the least recent
  CHECK_FALSE(m.pool().is_cached(ta[0]));
  CHECK(m.num_free_blocks() == 0);
  CHECK_FALSE(m.can_allocate(a));
  m.free(3);  // c was never committed: its blocks go to the free list, not the cache
  CHECK(m.pool().num_idle_cached_blocks() == 0);
  CHECK(m.allocate(4, a).num_cached_tokens == 0);
  m.check_integrity();
}

TEST_CASE("a chain stops where its blocks were written with other scales", "[cache][prefix]") {
  Manager m({2, 1, 16, true});
  // A caches block 0 of prefix P; B has the same block 0 but its own calibration, and caches
  // its block 1 (block 0's key was taken by A, so B's copy stays private).
  // Both are admitted in one step, before either committed, so B does not hit A.
  m.allocate(1, std::vector<int32_t>{1, 2, 9});
  m.allocate(2, std::vector<int32_t>{1, 2, 3, 4, 5});
  calibrate_and_commit(m, 1, 1.0f, 1.0f, 3);
  calibrate_and_commit(m, 2, 2.0f, 2.0f, 5);
  CHECK_FALSE(m.pool().is_cached(table_of(m, 2)[0]));
  CHECK(m.pool().is_cached(table_of(m, 2)[1]));
  // C shares both blocks' tokens, but mapping A's block 0 with B's block 1 would mix scales.
  CHECK(m.allocate(3, std::vector<int32_t>{1, 2, 3, 4, 6}).num_cached_tokens == 2);
  m.check_integrity();
  CHECK(m.scales(3) == m.scales(1));
  CHECK(table_of(m, 3)[0] == table_of(m, 1)[0]);
}

TEST_CASE("chunked prefill: scales freeze at the first commit and blocks cache as they fill", "[cache][prefix]") {
  Manager m({4, 2, 16, true});
  const auto prompt = iota_tokens(14);
  m.allocate(1, prompt);
  calibrate_and_commit(m, 1, 1.5f, 2.5f, 6);  // first chunk: block 0 full, block 1 half
  CHECK(m.scales_to_calibrate(1) == nullptr);
  CHECK(m.pool().is_cached(table_of(m, 1)[0]));
  CHECK_FALSE(m.pool().is_cached(table_of(m, 1)[1]));
  m.mark_computed(1, 12);
  m.check_integrity();
  CHECK(m.pool().is_cached(table_of(m, 1)[2]));
  CHECK(m.scales(1).k[1] == 3.0f);  // unchanged by later chunks
  CHECK_THROWS_AS(m.mark_computed(1, 11), std::logic_error);
  CHECK_THROWS_AS(m.mark_computed(1, 15), std::logic_error);
  m.mark_computed(1, 14);
  // A request arriving meanwhile hits all three full blocks.
  CHECK(m.allocate(2, prompt).num_cached_tokens == 12);
  m.check_integrity();
}

TEST_CASE("prefix caching disabled: no hits, freed blocks go straight back", "[cache]") {
  Manager m({4, 1, 4, false});
  m.allocate(1, iota_tokens(9));
  calibrate_and_commit(m, 1, 1.0f, 1.0f, 9);
  m.free(1);
  CHECK(m.allocate(2, iota_tokens(9)).num_cached_tokens == 0);
  CHECK(m.pool().num_idle_cached_blocks() == 0);
  CHECK(m.prefix_cache_stats().num_queried_tokens == 0);
  m.check_integrity();
}

TEST_CASE("misuse is an error, not corruption", "[cache]") {
  Manager m({4, 1, 4, true});
  m.allocate(1, iota_tokens(3));
  CHECK_THROWS_AS(m.allocate(1, iota_tokens(3)), std::logic_error);
  CHECK_THROWS_AS(m.free(7), std::logic_error);
  CHECK_THROWS_AS(m.append_slot(7, 1), std::logic_error);
  CHECK_THROWS_AS(m.fork(7, 8), std::logic_error);
  CHECK_THROWS_AS(m.block_table(7), std::logic_error);
  m.check_integrity();
  CHECK_THROWS_AS(BlockManager({4, 1, 0, true}), std::invalid_argument);
  CHECK_THROWS_AS(BlockManager({0, 1, 4, true}), std::invalid_argument);
  CHECK_THROWS_AS(BlockManager({4, 0, 4, true}), std::invalid_argument);
}

TEST_CASE("a preempted sequence re-admitted with its generated tokens reuses its own blocks", "[cache][prefix]") {
  Manager m({4, 2, 8, true});
  auto tokens = iota_tokens(6);
  m.allocate(1, tokens);
  calibrate_and_commit(m, 1, 0.75f, 0.5f, 6);
  for (int32_t t : {900, 901, 902}) {  // decode three tokens: the sequence now fills 2 blocks + 1
    m.append_slot(1, t);
    tokens.push_back(t);
    m.mark_computed(1, static_cast<int>(tokens.size()));
    m.check_integrity();
  }
  const fp8serve::KvScales scales = m.scales(1);
  const auto old_table = table_of(m, 1);
  m.free(1);  // preempted: recompute later
  m.check_integrity();
  const AllocateResult again = m.allocate(1, tokens);
  m.check_integrity();
  CHECK(again.num_cached_tokens == 8);  // both full blocks, decode-written one included
  CHECK(table_of(m, 1)[0] == old_table[0]);
  CHECK(table_of(m, 1)[1] == old_table[1]);
  CHECK(m.scales(1) == scales);  // the recomputed tail is quantized like the cached head
}

TEST_CASE("bf16 window: the FP8 rule, one tail ring per live sequence, none left over", "[cache][window]") {
  // Window 8 tokens, blocks of 4: rings of 3 blocks; 2 rings.
  BlockManagerOptions o{4, 2, 32, false, fp8serve::KvWindow{8, true, 4}, 2};
  Manager m(o);
  CHECK(m.num_tail_rings() == 2);
  CHECK(m.window().ring_blocks() == 3);
  // fp8_len(n) = floor((n - 8) / 4) * 4: the newest 8 tokens and the partial block before them.
  const int expected[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 8};
  for (int n = 0; n <= 16; ++n) CHECK(m.window().fp8_len(n) == expected[n]);

  m.allocate(1, iota_tokens(10));
  CHECK(m.tail_ring(1) == 0);
  CHECK(m.num_fp8_tokens(1) == 0);
  CHECK(m.fp8_len_after(1, 10) == 0);  // the whole prompt stays in the tail
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 10);
  m.allocate(2, iota_tokens(20, 500));
  CHECK(m.tail_ring(2) == 1);
  CHECK(m.fp8_len_after(2, 20) == 12);  // [0, 12) straight into FP8, [12, 20) into the tail
  CHECK_FALSE(m.can_allocate(iota_tokens(3), fp8serve::kNoCap, /*need_rings=*/1));  // blocks to spare, but no ring
  CHECK(m.can_allocate(iota_tokens(3)));  // ... which a new sequence does without: pure FP8
  calibrate_and_commit(m, 2, 0.5f, 0.25f, 20);
  CHECK(m.num_fp8_tokens(2) == 12);

  // Sequence 1 decodes: the step that ends at 12 tokens spills [0, 4).
  m.append_slot(1, 7);
  CHECK(m.fp8_len_after(1, 11) == 0);
  m.mark_computed(1, 11);
  m.append_slot(1, 8);
  CHECK(m.fp8_len_after(1, 12) == 4);
  m.mark_computed(1, 12);
  CHECK(m.num_fp8_tokens(1) == 4);
  m.check_integrity();

  m.free(1);
  CHECK(m.num_free_tail_rings() == 1);
  CHECK(m.can_allocate(iota_tokens(3)));
  m.allocate(3, iota_tokens(3));
  CHECK(m.tail_ring(3) == 0);  // the ring sequence 1 gave back
  m.check_integrity();
  m.free(2);
  m.free(3);
  CHECK(m.num_free_tail_rings() == 2);
  CHECK(m.num_free_blocks() == 32);
  m.check_integrity();

  BlockManagerOptions odd = o;
  odd.window.tokens = 6;  // not a multiple of the block size
  CHECK_THROWS_AS(BlockManager(odd), std::invalid_argument);
  BlockManagerOptions no_rings = o;
  no_rings.num_tail_rings = 0;
  CHECK_THROWS_AS(BlockManager(no_rings), std::invalid_argument);
}

TEST_CASE("bf16 window: only blocks out of every window are cached, and a hit stops before the new window", "[cache][window]") {
  BlockManagerOptions o{4, 2, 32, true, fp8serve::KvWindow{8, true, 4}, 4};
  Manager m(o);
  const auto prompt = iota_tokens(22);
  m.allocate(1, prompt);
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 22);
  CHECK(m.num_fp8_tokens(1) == 12);  // floor((22 - 8) / 4) * 4
  // Blocks 0-2 are final in FP8 and cached; blocks 3-5 are in the window: not cached.
  for (int b = 0; b < 6; ++b) CHECK(m.pool().is_cached(table_of(m, 1)[static_cast<std::size_t>(b)]) == (b < 3));

  // The same prompt again: its own window starts at 12, so the hit is 12 tokens.
  CHECK(m.allocate(2, prompt).num_cached_tokens == 12);
  CHECK(m.num_fp8_tokens(2) == 12);
  // A 17-token prompt with the same start: its window starts at 8, so 8 tokens, though 12 are cached.
  CHECK(m.allocate(3, iota_tokens(17)).num_cached_tokens == 8);
  CHECK(m.fp8_len_after(3, 17) == 8);
  m.check_integrity();

  // Sequence 1 decodes to 24 tokens: block 3 leaves the window and is cached once it is final.
  m.append_slot(1, 1);
  m.mark_computed(1, 23);
  CHECK_FALSE(m.pool().is_cached(table_of(m, 1)[3]));
  m.append_slot(1, 2);
  m.mark_computed(1, 24);
  CHECK(m.num_fp8_tokens(1) == 16);
  CHECK(m.pool().is_cached(table_of(m, 1)[3]));
  m.check_integrity();
}

TEST_CASE("bf16 window: a fork shares every block and the spill, not the append, makes one private", "[cache][window]") {
  BlockManagerOptions o{4, 2, 32, false, fp8serve::KvWindow{8, true, 4}, 4};
  Manager m(o);
  m.allocate(1, iota_tokens(14));
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 14);
  CHECK(m.num_fp8_tokens(1) == 4);
  m.fork(1, 2);
  CHECK(m.tail_ring(2) != m.tail_ring(1));  // its own ring (the engine copies the parent's)
  CHECK(table_of(m, 2) == table_of(m, 1));
  CHECK(m.num_fp8_tokens(2) == 4);
  m.check_integrity();

  // 15 tokens: no block leaves the window, the shared partial last block stays shared (the new
  // token goes to the tail), nothing is copied.
  const auto before = table_of(m, 2);
  AppendResult r = m.append_slot(2, 1);
  CHECK_FALSE(r.copy.has_value());
  CHECK(table_of(m, 2) == before);
  m.mark_computed(2, 15);
  m.check_integrity();
  // 16 tokens: block 1 leaves the window: the spill writes into it, so the child gets a fresh
  // block 1 (no copy: it held nothing final); the parent keeps the original.
  CHECK(m.fp8_len_after(2, 16) == 8);
  const int free_before = m.num_free_blocks();
  r = m.append_slot(2, 2);
  CHECK_FALSE(r.copy.has_value());
  const auto after = table_of(m, 2);
  CHECK(after[0] == before[0]);
  CHECK(after[1] != before[1]);
  CHECK(after[2] == before[2]);
  CHECK(table_of(m, 1)[1] == before[1]);
  CHECK(m.num_free_blocks() == free_before - 1);
  m.mark_computed(2, 16);
  m.check_integrity();
  // 17 tokens: a new block for the new token; nothing else moves.
  r = m.append_slot(2, 3);
  CHECK(table_of(m, 2).size() == 5);
  m.mark_computed(2, 17);
  m.check_integrity();
  m.free(1);
  m.free(2);
  CHECK(m.num_free_blocks() == 32);
  CHECK(m.num_free_tail_rings() == 4);
}

TEST_CASE("bf16 window, K only: every V is in the pool, so shared blocks are copied on write", "[cache][window]") {
  BlockManagerOptions o{4, 2, 32, false, fp8serve::KvWindow{8, false, 4}, 4};
  Manager m(o);
  m.allocate(1, iota_tokens(14));
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 14);
  m.fork(1, 2);
  const auto before = table_of(m, 2);
  // 15 tokens: the new token's V goes into the shared partial last block: copied first.
  AppendResult r = m.append_slot(2, 1);
  REQUIRE(r.copy.has_value());
  CHECK(r.copy->src == before[3]);
  CHECK(r.copy->dst == table_of(m, 2)[3]);
  CHECK_FALSE(r.spill_copy.has_value());
  m.mark_computed(2, 15);
  m.check_integrity();
  // 16 tokens: block 1 leaves the window; its V is final, so it is copied, not replaced blank.
  r = m.append_slot(2, 2);
  CHECK_FALSE(r.copy.has_value());  // block 3 is the child's own now
  REQUIRE(r.spill_copy.has_value());
  CHECK(r.spill_copy->src == before[1]);
  CHECK(r.spill_copy->dst == table_of(m, 2)[1]);
  m.mark_computed(2, 16);
  m.check_integrity();
  m.free(1);
  m.free(2);
  CHECK(m.num_free_blocks() == 32);
}

TEST_CASE("bf16 window: a sequence admitted with no free ring runs as pure FP8, and so do its forks", "[cache][window]") {
  // Window 8, blocks of 4, one ring.
  Manager m(BlockManagerOptions{4, 2, 40, true, fp8serve::KvWindow{8, true, 4}, 1});
  m.allocate(1, iota_tokens(10));
  CHECK(m.tail_ring(1) == 0);
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 10);
  CHECK(m.num_seqs_without_ring() == 0);

  // No ring left: sequence 2 (with one fork to come) is admitted without one, counted twice.
  m.allocate(2, iota_tokens(10, 300), fp8serve::kNoCap, /*group=*/2);
  CHECK(m.tail_ring(2) == -1);
  CHECK(m.num_seqs_without_ring() == 2);
  CHECK(m.fp8_len_after(2, 10) == 10);  // every computed position is FP8, as without a window
  calibrate_and_commit(m, 2, 0.5f, 0.25f, 10);
  CHECK(m.num_fp8_tokens(2) == 10);
  m.fork(2, 3);
  CHECK(m.tail_ring(3) == -1);
  m.check_integrity();
  // Its full blocks are final at once: offered to the prefix cache like any FP8 block.
  CHECK(m.num_cached_prefix_tokens(iota_tokens(30, 300)) == 8);
  // It decodes as without a window: the new token's slot is in the pool (a shared partial
  // block is copied on write), nothing spills.
  const AppendResult a = m.append_slot(3, 7);
  CHECK(a.copy.has_value());
  CHECK_FALSE(a.spill_copy.has_value());
  m.mark_computed(3, 11);
  CHECK(m.num_fp8_tokens(3) == 11);
  m.check_integrity();

  // The ring frees: the next sequence gets it; a group larger than the free rings gets none.
  m.free(1);
  m.allocate(4, iota_tokens(5, 700), fp8serve::kNoCap, /*group=*/2);
  CHECK(m.tail_ring(4) == -1);
  m.free(4);
  m.allocate(5, iota_tokens(5, 700));
  CHECK(m.tail_ring(5) == 0);
  m.check_integrity();
  m.free(2);
  m.free(3);
  m.free(5);
  CHECK(m.num_free_tail_rings() == 1);
  m.check_integrity();
}

TEST_CASE("bf16 window: a group's rings are reserved at admission for its forks", "[cache][window]") {
  Manager m(BlockManagerOptions{4, 2, 40, false, fp8serve::KvWindow{8, true, 4}, 3});
  m.allocate(1, iota_tokens(6), fp8serve::kNoCap, /*group=*/3);
  CHECK(m.tail_ring(1) >= 0);
  CHECK(m.num_free_tail_rings() == 0);  // two held for the forks
  m.allocate(2, iota_tokens(6, 300));  // a newcomer meanwhile: pure FP8, the forks keep theirs
  CHECK(m.tail_ring(2) == -1);
  calibrate_and_commit(m, 1, 0.5f, 0.25f, 6);
  m.fork(1, 3);
  m.fork(1, 4);
  CHECK(m.tail_ring(3) >= 0);
  CHECK(m.tail_ring(4) >= 0);
  CHECK(m.tail_ring(3) != m.tail_ring(4));
  m.check_integrity();
  m.free(1);
  m.free(3);
  m.free(4);
  m.free(2);
  CHECK(m.num_free_tail_rings() == 3);
  // Freed before forking: the reserved rings come back too.
  m.allocate(5, iota_tokens(6), fp8serve::kNoCap, /*group=*/2);
  CHECK(m.num_free_tail_rings() == 1);
  m.free(5);
  CHECK(m.num_free_tail_rings() == 3);
  m.check_integrity();
}
