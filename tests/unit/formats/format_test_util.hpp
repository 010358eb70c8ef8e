#pragma once
// Helpers shared by the formats tests: fixture paths, file reading, and a byte-level GGUF writer
// for crafting the malformed files the gguf package refuses to write.
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fp8serve::test {

inline std::string formats_fixture(const std::string& name) {
  return std::string(FP8SERVE_FIXTURES_DIR) + "/formats/" + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// Appends little-endian GGUF fields. Tests compose headers from these by hand.
struct GgufBytes {
  std::vector<uint8_t> bytes;

  template <typename T>
  GgufBytes& put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes.insert(bytes.end(), b, b + sizeof(T));
    return *this;
  }
  GgufBytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  GgufBytes& header(uint64_t num_tensors, uint64_t num_kv, uint32_t version = 3) {
    bytes.insert(bytes.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(version).put<uint64_t>(num_tensors).put<uint64_t>(num_kv);
    return *this;
  }
  GgufBytes& kv_u32(const std::string& key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
  GgufBytes& kv_f32(const std::string& key, float v) { return str(key).put<uint32_t>(6).put(v); }
  GgufBytes& kv_str(const std::string& key, const std::string& v) {
    return str(key).put<uint32_t>(8).str(v);
  }
  // Tensor info: name, dims (ggml order), type, offset.
  GgufBytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                    uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  GgufBytes& pad_to(uint64_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes.insert(bytes.end(), n, 0);
    return *this;
  }
  GgufBytes& f32s(const std::vector<float>& values) {
    for (float v : values) put(v);
    return *this;
  }
};

}  // namespace fp8serve::test
