#pragma once
// Shared by the tokenizer tests: the committed corpus, expected ids and paths.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/formats/gguf.hpp"

namespace fp8serve::test {

inline std::filesystem::path tokenizer_fixtures() { return std::filesystem::path(FP8SERVE_FIXTURES_DIR) / "tokenizer"; }
inline std::filesystem::path models_dir() { return FP8SERVE_MODELS_DIR; }

// One JSON string per line.
inline std::vector<std::string> read_jsonl_strings(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

inline std::vector<std::string> corpus() { return read_jsonl_strings(tokenizer_fixtures() / "corpus.jsonl"); }
inline std::vector<std::string> corpus_nfc() { return read_jsonl_strings(tokenizer_fixtures() / "corpus_nfc.jsonl"); }

// One line of space-separated ids per corpus line.
inline std::vector<std::vector<int32_t>> read_expected_ids(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::vector<int32_t> ids;
    for (int32_t id; ss >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

// GGUF v3 writer for metadata-only files.
struct GgufBuilder {
  std::string kv;
  uint64_t num_kv = 0;
  template <class T>
  void raw(T v) { kv.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  void str(const std::string& s) {
    raw<uint64_t>(s.size());
    kv += s;
  }
  void key(const std::string& k, uint32_t type) {
    str(k);
    raw<uint32_t>(type);
    ++num_kv;
  }
  void add_string(const std::string& k, const std::string& v) { key(k, 8); str(v); }
  void add_strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9);
    raw<uint32_t>(8);
    raw<uint64_t>(v.size());
    for (const auto& s : v) str(s);
  }
  void add_i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9);
    raw<uint32_t>(5);
    raw<uint64_t>(v.size());
    for (int32_t x : v) raw(x);
  }
  void add_u32(const std::string& k, uint32_t v) { key(k, 4); raw(v); }
  GgufFile build() const {
    std::string out = "GGUF";
    auto put = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    put(uint32_t{3});
    put(uint64_t{0});
    put(num_kv);
    out += kv;
    return GgufFile::from_bytes(std::vector<uint8_t>(out.begin(), out.end()));
  }
};

}  // namespace fp8serve::test
