// KV-cache events of the prefix cache (cache/kv_events.hpp): for each scenario the events a
// router must see, worked out by hand - exactly the blocks a new request could map, each after
// its parent, and removals only of blocks it was told about.
#include <catch2/catch.hpp>

#include <numeric>
#include <span>
#include <vector>

#include "cache/block_manager.hpp"

using fp8serve::BlockManager;
using fp8serve::BlockManagerOptions;
using fp8serve::KvCacheEvent;
using Type = fp8serve::KvCacheEvent::Type;

namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// The router's id of full block i of `tokens` (block_size bs): the chain key's first 8 bytes.
uint64_t id_of(const std::vector<int32_t>& tokens, int bs, int i) {
  fp8serve::BlockHash key{};
  for (int b = 0; b <= i; ++b) {
    const std::span<const int32_t> block(tokens.data() + b * bs, static_cast<std::size_t>(bs));
    key = fp8serve::hash_block_tokens(b == 0 ? nullptr : &key, block);
  }
  return fp8serve::external_block_hash(key);
}

std::vector<int32_t> slice(const std::vector<int32_t>& t, int begin, int end) { return {t.begin() + begin, t.begin() + end}; }

// The first chunk's calibration (one scale value for every layer) and the commit.
void commit(BlockManager& m, fp8serve::SeqId id, const std::vector<int32_t>& tokens, int n, float scale = 1.0f) {
  if (fp8serve::KvScales* s = m.scales_to_calibrate(id)) {
    for (auto& k : s->k) k = scale;
    for (auto& v : s->v) v = scale;
  }
  m.mark_computed(id, tokens, n);
  m.check_integrity();
}

}  // namespace

TEST_CASE("kv events: none unless enabled", "[cache][events]") {
  BlockManager m({4, 1, 8, true});
  const auto p = iota_tokens(9);
  m.allocate(1, p);
  commit(m, 1, p, 9);
  m.reset_prefix_cache();
  CHECK(m.take_events().empty());
}

TEST_CASE("kv events: a prompt's full blocks, one chain, each block after its parent", "[cache][events]") {
  BlockManager m({4, 1, 16, true});
  m.enable_events();
  const auto p = iota_tokens(14);  // blocks 0-2 full, 3 partial
  m.allocate(1, p);
  commit(m, 1, p, 6);  // first chunk: block 0 full
  auto events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].type == Type::block_stored);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(p, 4, 0)});
  CHECK_FALSE(events[0].parent_block_hash.has_value());
  CHECK(events[0].token_ids == slice(p, 0, 4));

  commit(m, 1, p, 14);  // blocks 1 and 2 fill: one event continuing the chain; the partial block never
  events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(p, 4, 1), id_of(p, 4, 2)});
  CHECK(events[0].parent_block_hash == id_of(p, 4, 0));
  CHECK(events[0].token_ids == slice(p, 4, 12));

  // Decoding fills block 3: announced once computed.
  m.append_slot(1);
  auto q = p;
  q.push_back(7);
  commit(m, 1, q, 15);
  CHECK(m.take_events().empty());
  m.append_slot(1);
  q.push_back(8);
  commit(m, 1, q, 16);
  events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(q, 4, 3)});
  CHECK(events[0].parent_block_hash == id_of(q, 4, 2));
  CHECK(events[0].token_ids == slice(q, 12, 16));
}

TEST_CASE("kv events: a prefix hit announces only its new blocks, after the hit", "[cache][events]") {
  BlockManager m({2, 1, 16, true});
  m.enable_events();
  const auto a = iota_tokens(5);
  m.allocate(1, a);
  commit(m, 1, a, 5);
  CHECK(m.take_events().size() == 1);  // blocks 0, 1
  auto b = slice(a, 0, 4);
  b.insert(b.end(), {40, 41, 42});
  CHECK(m.allocate(2, b).num_cached_tokens == 4);
  commit(m, 2, b, 7);
  const auto events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(b, 2, 2)});
  CHECK(events[0].parent_block_hash == id_of(a, 2, 1));
  CHECK(events[0].token_ids == std::vector<int32_t>{40, 41});
}

TEST_CASE("kv events: evictions remove what was announced, suffix first", "[cache][events]") {
  BlockManager m({2, 1, 4, true});
  m.enable_events();
  const auto a = iota_tokens(5);  // a0 a1 cached, partial block free on release
  m.allocate(1, a);
  commit(m, 1, a, 5);
  m.free(1);
  CHECK(m.take_events().size() == 1);
  // 4 blocks needed: the two free ones (a's partial, the spare) and two evictions, a1 first
  // (released first).
  const auto c = iota_tokens(8, 500);
  m.allocate(2, c);
  auto events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].type == Type::block_removed);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(a, 2, 1), id_of(a, 2, 0)});
  m.free(2);  // never computed: nothing was cached, nothing to remove
  CHECK(m.take_events().empty());
}

TEST_CASE("kv events: a block a new request could not map is never announced nor removed", "[cache][events]") {
  BlockManager m({2, 1, 16, true});
  m.enable_events();
  // As in "a chain stops where its blocks were written with other scales": A caches block 0,
  // B computed its own block 0 (same tokens, other scales: stays private) and caches block 1.
  const std::vector<int32_t> a = {1, 2, 9}, b = {1, 2, 3, 4, 5};
  m.allocate(1, a);
  m.allocate(2, b);
  commit(m, 1, a, 3, 1.0f);
  commit(m, 2, b, 5, 2.0f);
  REQUIRE(m.pool().is_cached(m.block_table(2)[1]));
  auto events = m.take_events();
  REQUIRE(events.size() == 1);  // A's block 0 only: B's block 1 sits behind A's block 0 with other scales
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(a, 2, 0)});
  CHECK_FALSE(m.pool().announced(m.block_table(2)[1]));
  // The same scales would have made it mappable: then it is announced (parent: A's block 0).
  BlockManager n({2, 1, 16, true});
  n.enable_events();
  n.allocate(1, a);
  n.allocate(2, b);
  commit(n, 1, a, 3, 1.0f);
  commit(n, 2, b, 5, 1.0f);
  events = n.take_events();
  REQUIRE(events.size() == 1);  // B's block 1 continues A's chain: one event, a0 then b1
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(a, 2, 0), id_of(b, 2, 1)});
  CHECK_FALSE(events[0].parent_block_hash.has_value());
  CHECK(events[0].token_ids == std::vector<int32_t>{1, 2, 3, 4});
}

TEST_CASE("kv events: a reset clears everything; later blocks chain only from what is cached", "[cache][events]") {
  BlockManager m({2, 1, 16, true});
  m.enable_events();
  const auto a = iota_tokens(9);
  m.allocate(1, a);
  commit(m, 1, a, 4);  // blocks 0, 1: announced but not yet taken
  m.allocate(2, iota_tokens(4, 300));
  commit(m, 2, iota_tokens(4, 300), 4);
  m.free(2);
  m.reset_prefix_cache();
  m.check_integrity();
  auto events = m.take_events();
  REQUIRE(events.size() == 1);  // what was pending is dropped: the router clears it anyway
  CHECK(events[0].type == Type::all_blocks_cleared);
  CHECK(m.pool().num_idle_cached_blocks() == 0);
  CHECK(m.num_cached_prefix_tokens(a) == 0);
  // Sequence 1 runs on; its block 2 is cached but its parent is not: unmappable, unannounced.
  commit(m, 1, a, 6);
  CHECK(m.take_events().empty());
  CHECK(m.num_cached_prefix_tokens(a) == 0);
  // A new prompt computes its chain again and it is announced from its start.
  const auto b = iota_tokens(5, 700);
  m.allocate(3, b);
  commit(m, 3, b, 5);
  events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(b, 2, 0), id_of(b, 2, 1)});
  CHECK_FALSE(events[0].parent_block_hash.has_value());
}

TEST_CASE("kv events: bf16 window blocks are announced when they leave the window", "[cache][events][window]") {
  BlockManagerOptions o{4, 2, 32, true, fp8serve::KvWindow{8, true, 4}, 4};
  BlockManager m(o);
  m.enable_events();
  auto p = iota_tokens(22);
  m.allocate(1, p);
  commit(m, 1, p, 22);
  auto events = m.take_events();
  REQUIRE(events.size() == 1);  // blocks 0-2: floor((22 - 8) / 4) = 3 final in FP8
  CHECK(events[0].block_hashes.size() == 3);
  for (int32_t t : {1, 2}) {
    m.append_slot(1);
    p.push_back(t);
    commit(m, 1, p, static_cast<int>(p.size()));
  }
  events = m.take_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].block_hashes == std::vector<uint64_t>{id_of(p, 4, 3)});
  CHECK(events[0].parent_block_hash == id_of(p, 4, 2));
}
