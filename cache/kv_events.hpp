#pragma once
// KV-cache events: what a prefix-aware router (Dynamo's KV indexer, llm-d's scheduler) must
// know to keep an index of this replica's prefix cache. The block pool records them as the cache
// changes; the server publishes them (server/kv_events.hpp, vLLM's wire format). Off unless
// BlockPool::enable_events(): then nothing is recorded and nothing costs.
//
//   block_stored        blocks a new request can now map: a chain of full blocks, each of
//                       block_size tokens, whose first block's parent is parent_block_hash
//                       (none: the chain starts the prompt). Announced only after its parent.
//   block_removed       blocks evicted from the cache (only blocks once announced).
//   all_blocks_cleared  the whole cache was dropped (reset).
#include <cstdint>
#include <optional>
#include <vector>

#include "cache/block_hash.hpp"

namespace fp8serve {

struct KvCacheEvent {
  enum class Type : uint8_t { block_stored, block_removed, all_blocks_cleared };
  Type type = Type::block_stored;
  std::vector<uint64_t> block_hashes;
  std::optional<uint64_t> parent_block_hash;  // block_stored only
  std::vector<int32_t> token_ids;             // block_stored only: block_size per hash, in order
};

// The 64-bit id a router sees for a block: the first 8 bytes of its SHA-256 chain key, big-endian.
// Routers key blocks by their own hashes of token_ids and use this one only as an opaque id, so
// 64 bits (what Dynamo's indexer takes) are enough; the cache itself still compares all 32 bytes.
inline uint64_t external_block_hash(const BlockHash& key) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | key[static_cast<std::size_t>(i)];
  return value;
}

}  // namespace fp8serve
