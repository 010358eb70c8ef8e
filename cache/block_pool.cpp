#include "cache/block_pool.hpp"

#include <stdexcept>
#include <string>

namespace fp8serve {

namespace {

[[noreturn]] void broken(const std::string& what) { throw std::logic_error("BlockPool: " + what); }

}  // namespace

BlockPool::BlockPool(int num_blocks, bool enable_prefix_caching)
    : enable_prefix_caching_(enable_prefix_caching) {
  if (num_blocks <= 0) {
    throw std::invalid_argument("KV cache has no blocks: raise --kv-cache-memory or lower --block-size");
  }
  blocks_.resize(static_cast<std::size_t>(num_blocks));
  free_list_.reserve(blocks_.size());
  // Reversed so that allocate() hands out 0, 1, 2, ... on a fresh pool (readable logs/tests).
  for (int32_t b = num_blocks - 1; b >= 0; --b) {
    free_list_.push_back(b);
    blocks_[static_cast<std::size_t>(b)].on_free_list = true;
  }
}

const BlockPool::Block& BlockPool::at(int32_t block) const {
  if (block < 0 || block >= num_blocks()) broken("block id " + std::to_string(block) + " out of range");
  return blocks_[static_cast<std::size_t>(block)];
}

BlockPool::Block& BlockPool::at(int32_t block) {
  return const_cast<Block&>(static_cast<const BlockPool*>(this)->at(block));
}

int32_t BlockPool::allocate() {
  int32_t block;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
    at(block).on_free_list = false;
  } else if (!lru_.empty()) {
    block = lru_.front();
    evict(block);
  } else {
    broken("allocate() on an exhausted pool (call can_allocate / can_append first)");
  }
  at(block).ref_count = 1;
  return block;
}

void BlockPool::evict(int32_t block) {
  Block& b = at(block);
  lru_.erase(b.lru_pos);
  b.on_lru = false;
  cached_.erase(*b.key);
  if (b.announced) {
    const uint64_t hash = external_block_hash(*b.key);
    if (!events_.empty() && events_.back().type == KvCacheEvent::Type::block_removed) {
      events_.back().block_hashes.push_back(hash);
    } else {
      events_.push_back({KvCacheEvent::Type::block_removed, {hash}, std::nullopt, {}});
    }
  }
  b.key.reset();
  b.scales.reset();
  b.announced = false;
  ++num_evictions_;
}

void BlockPool::reset_prefix_cache() {
  for (int32_t id = 0; id < num_blocks(); ++id) {
    Block& b = blocks_[static_cast<std::size_t>(id)];
    if (!b.key) continue;
    b.key.reset();
    b.scales.reset();
    b.announced = false;
    if (b.on_lru) {
      b.on_lru = false;
      b.on_free_list = true;
      free_list_.push_back(id);
    }
  }
  lru_.clear();
  cached_.clear();
  if (events_enabled_) {
    events_.clear();
    events_.push_back({KvCacheEvent::Type::all_blocks_cleared, {}, std::nullopt, {}});
  }
}

void BlockPool::announce(int32_t block, const BlockHash* parent, std::span<const int32_t> tokens) {
  if (!events_enabled_) return;
  Block& b = at(block);
  if (!b.key) broken("announce() of uncached block " + std::to_string(block));
  std::optional<uint64_t> parent_hash;
  if (parent != nullptr) {
    const std::optional<int32_t> p = lookup(*parent);
    if (!p || !at(*p).announced || !(*at(*p).scales == *b.scales)) return;
    parent_hash = external_block_hash(*parent);
  }
  b.announced = true;
  const uint64_t hash = external_block_hash(*b.key);
  KvCacheEvent* last = events_.empty() ? nullptr : &events_.back();
  if (last != nullptr && last->type == KvCacheEvent::Type::block_stored && parent_hash == last->block_hashes.back()) {
    last->block_hashes.push_back(hash);
    last->token_ids.insert(last->token_ids.end(), tokens.begin(), tokens.end());
    return;
  }
  events_.push_back({KvCacheEvent::Type::block_stored, {hash}, parent_hash, {tokens.begin(), tokens.end()}});
}

std::vector<KvCacheEvent> BlockPool::take_events() {
  std::vector<KvCacheEvent> out;
  out.swap(events_);
  return out;
}

std::optional<int32_t> BlockPool::lookup(const BlockHash& key) const {
  const auto it = cached_.find(key);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::acquire(int32_t block) {
  Block& b = at(block);
  if (b.on_free_list) broken("acquire() of a free block " + std::to_string(block));
  if (b.on_lru) {
    lru_.erase(b.lru_pos);
    b.on_lru = false;
  }
  ++b.ref_count;
}

void BlockPool::release(int32_t block) {
  Block& b = at(block);
  if (b.ref_count <= 0) broken("release() of unreferenced block " + std::to_string(block));
  if (--b.ref_count > 0) return;
  if (b.key) {
    b.lru_pos = lru_.insert(lru_.end(), block);
    b.on_lru = true;
  } else {
    free_list_.push_back(block);
    b.on_free_list = true;
  }
}

bool BlockPool::register_block(int32_t block, const BlockHash& key, std::shared_ptr<KvScales> scales) {
  Block& b = at(block);
  if (!enable_prefix_caching_) broken("register_block() with prefix caching disabled");
  if (b.ref_count <= 0) broken("register_block() of unreferenced block " + std::to_string(block));
  if (b.key) broken("register_block() of block " + std::to_string(block) + " cached twice");
  if (!scales || !scales->frozen) broken("register_block() needs the frozen scales the block was written with");
  if (!cached_.emplace(key, block).second) return false;
  b.key = key;
  b.scales = std::move(scales);
  return true;
}

void BlockPool::check_integrity(const std::vector<int>& expected_refs) const {
  if (expected_refs.size() != blocks_.size()) broken("check_integrity(): wrong expected_refs size");
  std::size_t num_on_free = 0, num_on_lru = 0, num_keyed = 0;
  for (int32_t id = 0; id < num_blocks(); ++id) {
    const Block& b = blocks_[static_cast<std::size_t>(id)];
    const std::string name = "block " + std::to_string(id);
    if (b.ref_count != expected_refs[static_cast<std::size_t>(id)]) {
      broken(name + " ref_count " + std::to_string(b.ref_count) + " but " +
             std::to_string(expected_refs[static_cast<std::size_t>(id)]) + " block-table entries");
    }
    // free xor idle xor in use
    const int states = int(b.on_free_list) + int(b.on_lru) + int(b.ref_count > 0);
    if (states != 1) broken(name + " is in " + std::to_string(states) + " of the states free/idle/in use");
    if (b.on_free_list && b.key) broken(name + " is free but still cached");
    if (b.on_lru && !b.key) broken(name + " is on the LRU but not cached");
    if (b.key.has_value() != static_cast<bool>(b.scales)) broken(name + " key and scales disagree");
    if (b.announced && !b.key) broken(name + " is announced but not cached");
    if (b.key) {
      ++num_keyed;
      if (!b.scales->frozen) broken(name + " is cached with unfrozen scales");
      const auto it = cached_.find(*b.key);
      if (it == cached_.end() || it->second != id) broken(name + " key does not map back to it");
    }
    num_on_free += b.on_free_list;
    num_on_lru += b.on_lru;
  }
  if (num_on_free != free_list_.size()) broken("free list holds duplicates or stale entries");
  if (num_on_lru != lru_.size()) broken("LRU holds duplicates or stale entries");
  if (num_keyed != cached_.size()) broken("cache map holds entries for uncached blocks");
  for (const int32_t id : free_list_) {
    if (!at(id).on_free_list) broken("free list names block " + std::to_string(id) + " that is not free");
  }
  for (const int32_t id : lru_) {
    if (!at(id).on_lru) broken("LRU names block " + std::to_string(id) + " that is not idle");
  }
  if (!enable_prefix_caching_ && !cached_.empty()) broken("blocks cached with prefix caching disabled");
}

}  // namespace fp8serve
