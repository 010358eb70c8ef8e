#pragma once
// Physical KV blocks: reference counts, the free list and the prefix cache's LRU.
//
// Every block is in exactly one state:
//   free    ref_count 0, no key, on the free list;
//   idle    ref_count 0, cached under a key, on the LRU list (evictable, still hittable);
//   in use  ref_count > 0 (cached or not), on neither list.
// allocate() takes from the free list first and evicts the least recently released idle block
// only when the free list is empty, so cached prefixes survive as long as memory allows.
// Pure host bookkeeping; which bytes a block id names is the kernels' business (paged view).
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.hpp"
#include "cache/kv_events.hpp"
#include "cache/kv_scales.hpp"

namespace fp8serve {

class BlockPool {
 public:
  BlockPool(int num_blocks, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks allocate() can hand out now: free plus idle cached (evictable) ones.
  int num_free_blocks() const { return static_cast<int>(free_list_.size() + lru_.size()); }
  int num_idle_cached_blocks() const { return static_cast<int>(lru_.size()); }
  uint64_t num_evictions() const { return num_evictions_; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }

  int ref_count(int32_t block) const { return at(block).ref_count; }
  bool is_cached(int32_t block) const { return at(block).key.has_value(); }
  // The scales the cached block was written with; null for an uncached block.
  const std::shared_ptr<KvScales>& cached_scales(int32_t block) const { return at(block).scales; }

  // A block with ref_count 1. PRECOND: num_free_blocks() > 0 (std::logic_error otherwise).
  int32_t allocate();
  // The cached block under `key`, if any (idle or in use).
  std::optional<int32_t> lookup(const BlockHash& key) const;
  // ++ref_count; an idle cached block leaves the LRU (a prefix hit revives it).
  void acquire(int32_t block);
  // --ref_count; at zero the block goes to the LRU if cached, else to the free list.
  void release(int32_t block);
  // Caches an in-use block under `key` with the (frozen) scales it was written with. Returns
  // false and changes nothing if the key already names another block: the first writer stays.
  bool register_block(int32_t block, const BlockHash& key, std::shared_ptr<KvScales> scales);

  // Drops every key: idle cached blocks become free, blocks in use stay with their holders but
  // are no longer hittable. With events: one all_blocks_cleared, and what was pending before it
  // is dropped (the router would clear it anyway).
  void reset_prefix_cache();

  // KV-cache events (cache/kv_events.hpp), off by default. Once enabled, announce() after a
  // successful register_block(), and evictions and resets record their own events.
  void enable_events() { events_enabled_ = true; }
  bool events_enabled() const { return events_enabled_; }
  // A block_stored for `block`, cached under `key` by register_block(), if a new request could
  // map it: it starts a chain (parent null), or its parent key names a cached block that was
  // announced and written with the same scales (the rule match_prefix() follows). A block_stored
  // that continues the previous one (same chain) is merged into it. No-op without events.
  void announce(int32_t block, const BlockHash* parent, std::span<const int32_t> tokens);
  bool announced(int32_t block) const { return at(block).announced; }
  // The events recorded since the last call, oldest first.
  std::vector<KvCacheEvent> take_events();

  // Throws std::logic_error unless the state invariants hold and every block's ref_count
  // equals expected_refs[block] (the number of block-table entries naming it).
  void check_integrity(const std::vector<int>& expected_refs) const;

 private:
  struct Block {
    int ref_count = 0;
    std::optional<BlockHash> key;
    std::shared_ptr<KvScales> scales;  // set iff key is
    std::list<int32_t>::iterator lru_pos;
    bool on_lru = false;
    bool on_free_list = false;
    bool announced = false;  // a block_stored event named it (events on; cached)
  };

  const Block& at(int32_t block) const;
  Block& at(int32_t block);
  void evict(int32_t block);

  bool enable_prefix_caching_;
  std::vector<Block> blocks_;       // [num_blocks]
  std::vector<int32_t> free_list_;  // LIFO: recently freed blocks are reused first (warm)
  std::list<int32_t> lru_;          // idle cached blocks, least recently released first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
  uint64_t num_evictions_ = 0;
  bool events_enabled_ = false;
  std::vector<KvCacheEvent> events_;
};

}  // namespace fp8serve
