#include "cache/block_hash.hpp"

#include <openssl/evp.h>

#include <stdexcept>
#include <vector>

namespace fp8serve {

BlockHash hash_block_tokens(const BlockHash* parent, std::span<const int32_t> tokens) {
  // Serialize explicitly little-endian so the key does not depend on the host.
  std::vector<uint8_t> message(sizeof(BlockHash) + tokens.size() * 4, 0);
  if (parent != nullptr) std::memcpy(message.data(), parent->data(), sizeof(BlockHash));
  uint8_t* out = message.data() + sizeof(BlockHash);
  for (const int32_t token : tokens) {
    const auto u = static_cast<uint32_t>(token);
    out[0] = static_cast<uint8_t>(u);
    out[1] = static_cast<uint8_t>(u >> 8);
    out[2] = static_cast<uint8_t>(u >> 16);
    out[3] = static_cast<uint8_t>(u >> 24);
    out += 4;
  }
  BlockHash digest{};
  unsigned int digest_len = 0;
  if (EVP_Digest(message.data(), message.size(), digest.data(), &digest_len, EVP_sha256(), nullptr) != 1 ||
      digest_len != digest.size()) {
    throw std::runtime_error("SHA-256 of a KV block failed (OpenSSL EVP_Digest)");
  }
  return digest;
}

std::string to_hex(const BlockHash& hash) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(hash.size() * 2, '0');
  for (std::size_t i = 0; i < hash.size(); ++i) {
    text[2 * i] = kDigits[hash[i] >> 4];
    text[2 * i + 1] = kDigits[hash[i] & 0xf];
  }
  return text;
}

}  // namespace fp8serve
