#pragma once
// Content keys of full KV blocks for prefix caching.
//
// key(block i) = SHA-256(key(block i-1) || token ids of block i), with 32 zero bytes standing in
// for the predecessor of block 0 and each token id as 4 bytes little-endian. The chain makes a
// key name the whole prefix, not just one block. SHA-256 and not std::hash: a predictable or
// collidable key would let one client map blocks another client's prompt wrote, i.e. read
// another tenant's KV. tests/scripts/make_block_hash_vectors.py computes the same with hashlib.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace fp8serve {

using BlockHash = std::array<uint8_t, 32>;

// PRECOND: none; any token ids (negative too) hash. Throws std::runtime_error if OpenSSL fails.
BlockHash hash_block_tokens(const BlockHash* parent, std::span<const int32_t> tokens);

std::string to_hex(const BlockHash& hash);

// Bucketing for unordered_map: the key is already a uniform SHA-256 digest, so its first
// bytes are a fine bucket index (this is not the security boundary; the full key compares).
struct BlockHashHasher {
  std::size_t operator()(const BlockHash& hash) const {
    std::size_t bucket;
    std::memcpy(&bucket, hash.data(), sizeof bucket);
    return bucket;
  }
};

}  // namespace fp8serve
