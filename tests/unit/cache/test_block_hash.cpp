// Prefix-cache block keys against vectors computed independently with Python's hashlib
// (tests/scripts/make_block_hash_vectors.py, committed in tests/fixtures/cache/).
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cache/block_hash.hpp"

namespace {

struct VectorLine {
  int index = 0;
  std::vector<int32_t> tokens;
  std::string hex_key;
};

std::map<std::string, std::vector<VectorLine>> load_vectors() {
  const std::string path = std::string(FP8SERVE_FIXTURES_DIR) + "/cache/block_hash_vectors.txt";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path);
  std::map<std::string, std::vector<VectorLine>> chains;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string chain, tokens;
    VectorLine v;
    fields >> chain >> v.index >> tokens >> v.hex_key;
    if (!fields) throw std::runtime_error("bad fixture line: " + line);
    std::istringstream token_list(tokens);
    for (std::string t; std::getline(token_list, t, ',');) v.tokens.push_back(static_cast<int32_t>(std::stoll(t)));
    chains[chain].push_back(v);
  }
  return chains;
}

}  // namespace

TEST_CASE("chained block keys match hashlib vectors", "[cache][hash]") {
  const auto chains = load_vectors();
  REQUIRE(chains.size() == 5);
  for (const auto& [name, lines] : chains) {
    INFO("chain " << name);
    fp8serve::BlockHash parent{};
    for (std::size_t i = 0; i < lines.size(); ++i) {
      REQUIRE(lines[i].index == static_cast<int>(i));
      const fp8serve::BlockHash key = fp8serve::hash_block_tokens(i == 0 ? nullptr : &parent, lines[i].tokens);
      CHECK(fp8serve::to_hex(key) == lines[i].hex_key);
      parent = key;
    }
  }
}

TEST_CASE("a key depends on the whole prefix, not only the block", "[cache][hash]") {
  const std::vector<int32_t> block = {7, 7, 7, 7};
  const fp8serve::BlockHash first = fp8serve::hash_block_tokens(nullptr, block);
  const fp8serve::BlockHash second = fp8serve::hash_block_tokens(&first, block);
  CHECK(first != second);
  // A nullptr parent means 32 zero bytes, stated explicitly.
  const fp8serve::BlockHash zeros{};
  CHECK(fp8serve::hash_block_tokens(&zeros, block) == first);
  // Token order and width matter: {1, 0} and {256} serialize differently.
  CHECK(fp8serve::hash_block_tokens(nullptr, std::vector<int32_t>{1, 0}) !=
        fp8serve::hash_block_tokens(nullptr, std::vector<int32_t>{0, 1}));
}
