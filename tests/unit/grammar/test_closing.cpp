// Budget-aware closing: bytes_to_end() is the exact length of the shortest completion (checked
// by breadth-first search over bytes), and a walk that switches to the closing mask once its
// budget only just suffices always ends with a complete document within the budget.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>

#include "grammar_test_util.hpp"

using namespace fp8serve::grammar;
using namespace fp8serve::grammar::test;

namespace {

// The fewest bytes after which the matcher may end, by breadth-first search (small grammars).
int64_t shortest_completion(const GrammarMatcher& start, int max_depth) {
  std::vector<GrammarMatcher> frontier{start};
  for (int depth = 0; depth <= max_depth; ++depth) {
    std::vector<GrammarMatcher> next;
    for (GrammarMatcher& m : frontier) {
      if (m.can_end()) return depth;
      for (int b = 0; b < 256 && next.size() < 20000; ++b) {
        GrammarMatcher copy = m;
        if (copy.accept_bytes(std::string(1, static_cast<char>(b)))) next.push_back(std::move(copy));
      }
    }
    frontier = std::move(next);
  }
  return -1;
}

}  // namespace

TEST_CASE("bytes_to_end is the shortest completion") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"type": "integer", "minimum": 100})", {"", "1", "10"}},
      {R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2})", {"", "[", "[tr", "[true, "}},
      {R"({"$defs": {"n": {"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"})",
       {"", "{\"k\": {\"k\": "}},
  };
  for (const auto& [schema, prefixes] : cases) {
    const auto g = compile(schema);
    for (const std::string& prefix : prefixes) {
      GrammarMatcher m(g);
      if (!prefix.empty()) REQUIRE(m.accept_bytes(prefix));
      INFO(schema << " after '" << prefix << "'");
      CHECK(m.bytes_to_end() == shortest_completion(m, 14));
    }
  }
}

TEST_CASE("bytes_to_end on an object: the shortest completion written out") {
  const auto g = compile(R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 2},
                             "b": {"enum": ["xy", "z"]}}, "required": ["a", "b"]})");
  // The shortest document is {"a":"xx","b":"z"}: 18 bytes.
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"", 18}, {"{", 17}, {"{\"a\": \"", 12}, {"{\"a\": \"qq\"", 9}, {"{\"a\": \"qq\", \"b\": ", 4}, {"{\"a\":\"qq\",\"b\":\"z\"}", 0}};
  for (const auto& [prefix, want] : cases) {
    GrammarMatcher m(g);
    if (!prefix.empty()) REQUIRE(m.accept_bytes(prefix));
    INFO(prefix);
    CHECK(m.bytes_to_end() == want);
  }
}

TEST_CASE("walks that close on a budget always end complete, within the budget") {
  std::ifstream in(std::filesystem::path(FP8SERVE_FIXTURES_DIR) / "grammar" / "schemas.json");
  const Json cases = Json::parse(in);
  std::mt19937_64 rng(5);
  std::vector<uint64_t> mask(static_cast<size_t>(byte_vocab()->mask_words()));
  int closed = 0;
  for (const Json& c : cases) {
    const auto g = compile(c["schema"]);
    for (int w = 0; w < 8; ++w) {
      GrammarMatcher m(g, /*allow_end_tokens=*/false);
      const int64_t budget = m.bytes_to_end() + static_cast<int64_t>(rng() % 40);
      bool closing = false;
      int64_t used = 0;
      while (used < budget && !m.is_terminated() && !(closing && m.can_end())) {
        if (!closing && m.bytes_to_end() >= budget - used) closing = true;
        if (closing) {
          const int64_t before = m.bytes_to_end();
          m.fill_closing_bitmask(mask);
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < 256; ++id)
            if (bitmask_test(mask, id)) allowed.push_back(id);
          REQUIRE_FALSE(allowed.empty());
          REQUIRE(m.accept_token(allowed[rng() % allowed.size()]));
          REQUIRE(m.bytes_to_end() == before - 1);
        } else {
          m.fill_next_token_bitmask(mask);
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < 256; ++id)
            if (bitmask_test(mask, id)) allowed.push_back(id);
          const int32_t pick = allowed[rng() % allowed.size()];
          if (!m.can_finish_after(pick, budget - used - 1)) {
            closing = true;  // as the engine does: refuse it, and close from here
            continue;
          }
          REQUIRE(m.accept_token(pick));
        }
        ++used;
      }
      INFO(c["name"].get<std::string>() << " budget " << budget);
      CHECK(m.can_end());
      CHECK(used <= budget);
      closed += closing ? 1 : 0;
    }
  }
  CHECK(closed > 100);  // most random walks need the budget to end them
}
