// Closing within a budget. bytes_to_end() is the exact shortest completion in bytes (checked by
// breadth-first search over bytes). tokens_to_end(), fits_after() and fill_budget_bitmask()
// are the shortest completion in tokens (ClosingGraph), checked against a breadth-first search
// over token sequences on small vocabularies whose tokens span grammar symbols; and a walk
// that keeps to the budget mask always ends complete within its budget, exactly at it when the
// budget is the fewest tokens, and token for token as without a budget when it has room.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <random>
#include <set>

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

constexpr int64_t kTooBig = -2;

// The fewest tokens after which the matcher may end: breadth-first over token sequences, where
// two sequences that write the same text are one (the text alone decides what may follow).
// max_depth + 1 when none ends within max_depth tokens; kTooBig past `cap` texts.
int64_t brute_tokens_to_end(const GrammarMatcher& start, int max_depth, size_t cap = 20000) {
  const TokenVocabulary& vocab = start.grammar().vocab();
  std::vector<std::pair<std::string, GrammarMatcher>> frontier{{"", start}};
  std::set<std::string> seen{""};
  for (int depth = 0; depth <= max_depth; ++depth) {
    std::vector<std::pair<std::string, GrammarMatcher>> next;
    for (auto& [text, m] : frontier) {
      if (m.can_end()) return depth;
      if (depth == max_depth) continue;
      for (int32_t id = 0; id < vocab.mask_size(); ++id) {
        if (!vocab.usable(id)) continue;
        std::string longer = text + std::string(vocab.bytes(id));
        if (seen.count(longer)) continue;
        GrammarMatcher copy = m;
        if (!copy.accept_token(id)) continue;
        seen.insert(longer);
        next.emplace_back(std::move(longer), std::move(copy));
        if (next.size() > cap) return kTooBig;
      }
    }
    frontier = std::move(next);
  }
  return max_depth + 1;
}

// A vocabulary without every byte: some single characters, and multi-byte tokens that cross
// JSON symbols ("},{", ":"), say keys whole, or spell only part of a value.
std::shared_ptr<const TokenVocabulary> small_vocab() {
  static const auto vocab = [] {
    std::vector<std::string> bytes = {"{", "}", "[", "]", "\"", ":", ",", " ", "0", "1", "2", "a", "b", "e", "-", "t",
                                      "{\"", "\"}", "\":", "\":\"", "\",\"", "\"a", "ab", "abab", "name", "na", "me",
                                      "age", "\"name\":\"", "\"},{\"", "true", "tr", "ue", "12", "\"]", "[\"", "[{\"",
                                      "\"}]", "}]", "]}", ", \"", "\": ", "celsius", "ce", "ls", "ius", "fahrenheit",
                                      "fa", "hr", "en", "he", "it", "k", "\"k\":", "null", "nu", "ll", "\"\"", "ee"};
    std::vector<uint8_t> usable(bytes.size(), 1);
    bytes.push_back("<eos>");
    usable.push_back(0);
    const auto eos = static_cast<int32_t>(bytes.size()) - 1;
    return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(usable), std::vector<int32_t>{eos}, eos + 3);
  }();
  return vocab;
}

const std::vector<std::string>& small_schemas() {
  static const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": false})",
      R"({"enum": ["celsius", "fahrenheit"]})",
      R"({"type": "object", "properties": {"unit": {"enum": ["fahrenheit", "celsius"]}}, "required": ["unit"]})",
      R"({"type": "string", "minLength": 5})",
      R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2})",
      R"({"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
          "minItems": 1, "maxItems": 3})",
      R"({"$defs": {"n": {"type": "object", "properties": {"k": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}},
          "required": ["k"]}}, "$ref": "#/$defs/n"})",
      R"({"anyOf": [{"type": "integer", "minimum": 100}, {"type": "string", "maxLength": 3}]})",
      R"({"type": "object", "properties": {"ab": {"type": "boolean"}, "name": {"type": "string", "pattern": "^(ab)+$"}},
          "required": ["name"]})",
  };
  return schemas;
}

// States met on random walks through `g` (the matcher after each token), at most `count`.
std::vector<GrammarMatcher> walk_states(const std::shared_ptr<const CompiledGrammar>& g, int count, uint64_t seed) {
  const TokenVocabulary& vocab = g->vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask(static_cast<size_t>(vocab.mask_words()));
  std::vector<GrammarMatcher> out;
  while (static_cast<int>(out.size()) < count) {
    GrammarMatcher m(g, /*allow_end_tokens=*/false);
    out.push_back(m);
    for (int step = 0; step < 12 && !m.is_terminated() && static_cast<int>(out.size()) < count; ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab.mask_size(); ++id)
        if (bitmask_test(mask, id)) allowed.push_back(id);
      if (allowed.empty()) break;  // the vocabulary cannot continue here
      REQUIRE(m.accept_token(allowed[rng() % allowed.size()]));
      out.push_back(m);
    }
  }
  return out;
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

TEST_CASE("tokens_to_end: the shortest completion in tokens, written out") {
  // {"name":"","age":0}: 19 bytes, and 7 tokens: { "name":" "," age ": 0 }.
  const auto g = compile(Json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                                         "required": ["name", "age"], "additionalProperties": false})"),
                         small_vocab());
  GrammarMatcher m(g);
  CHECK(m.bytes_to_end() == 19);
  CHECK(m.tokens_to_end(30) == 7);
  CHECK(m.tokens_to_end(6) == 7);   // "more than the limit"
  // An enum: "fahrenheit" is longer in bytes but as short in tokens, "celsius" no shorter.
  const auto unit = compile(Json::parse(R"({"enum": ["celsius", "fahrenheit"]})"), small_vocab());
  GrammarMatcher u(unit);
  CHECK(u.bytes_to_end() == 9);
  CHECK(u.tokens_to_end(10) == 3);
  REQUIRE(u.accept_bytes("\""));
  std::vector<uint64_t> mask(static_cast<size_t>(small_vocab()->mask_words()));
  u.fill_budget_bitmask(mask, 1);  // one token, then the closing quote: both whole words
  std::set<std::string> words;
  for (int32_t id = 0; id < small_vocab()->mask_size(); ++id)
    if (bitmask_test(mask, id)) words.insert(std::string(small_vocab()->bytes(id)));
  CHECK(words == std::set<std::string>{"celsius", "fahrenheit"});
}

TEST_CASE("tokens_to_end, fits_after and the budget mask equal a brute-force search") {
  const int kDepth = 6;
  int compared = 0, masks = 0;
  for (size_t s = 0; s < small_schemas().size(); ++s) {
    const auto g = compile(Json::parse(small_schemas()[s]), small_vocab());
    const TokenVocabulary& vocab = g->vocab();
    std::vector<uint64_t> mask(static_cast<size_t>(vocab.mask_words())), allowed_mask(mask.size());
    std::vector<GrammarMatcher> states = walk_states(g, 40, 11 + s);
    int per_schema = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      GrammarMatcher& m = states[i];
      const int64_t want = brute_tokens_to_end(m, kDepth);
      if (want == kTooBig) continue;
      INFO(small_schemas()[s] << " state " << i);
      CHECK(m.tokens_to_end(kDepth) == want);
      ++compared;
      ++per_schema;
      if (i % 4 != 0) continue;
      // Every allowed token against the search from the state after it.
      m.fill_next_token_bitmask(allowed_mask);
      for (const int64_t budget : {0, 1, 2, 4}) {
        CHECK(m.fill_budget_bitmask(mask, budget));  // settled: these graphs are small
        for (int32_t id = 0; id < vocab.mask_size(); ++id) {
          if (!bitmask_test(allowed_mask, id) || vocab.is_end_token(id)) {
            CHECK_FALSE(bitmask_test(mask, id));
            continue;
          }
          GrammarMatcher after = m;
          REQUIRE(after.accept_token(id));
          const int64_t rest = brute_tokens_to_end(after, static_cast<int>(budget));
          INFO("token '" << vocab.bytes(id) << "' budget " << budget << " rest " << rest);
          CHECK(bitmask_test(mask, id) == (rest <= budget));
          CHECK(m.fits_after(id, budget) == (rest <= budget));
        }
        ++masks;
      }
    }
    INFO(small_schemas()[s]);
    CHECK(per_schema >= 10);
  }
  CHECK(compared > 200);
  CHECK(masks > 50);
}

TEST_CASE("with one byte per token, tokens_to_end is bytes_to_end") {
  std::ifstream in(std::filesystem::path(FP8SERVE_FIXTURES_DIR) / "grammar" / "schemas.json");
  const Json cases = Json::parse(in);
  int checked = 0;
  for (size_t c = 0; c < cases.size(); c += 3) {
    const auto g = compile(cases[c]["schema"]);
    for (GrammarMatcher& m : walk_states(g, 12, c)) {
      INFO(cases[c]["name"].get<std::string>());
      CHECK(m.tokens_to_end(1000) == m.bytes_to_end());
      ++checked;
    }
  }
  CHECK(checked > 150);
}

namespace {

// The engine's loop without a model: a fixed preference over tokens (a hash of the step and
// the id, standing in for logits), the grammar mask, and with a budget the engine's rule: a
// token that does not fit is refused and the choice is made again from the budget mask.
struct WalkResult {
  std::vector<int32_t> tokens;
  bool complete = false;
};

constexpr int64_t kNoBudget = INT64_MAX / 4;

// Stops after 400 tokens, incomplete.
WalkResult walk(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, int64_t budget) {
  const TokenVocabulary& vocab = g->vocab();
  std::vector<uint64_t> mask(static_cast<size_t>(vocab.mask_words()));
  auto best = [&](int step) {
    int32_t pick = -1;
    uint64_t top = 0;
    for (int32_t id = 0; id < vocab.mask_size(); ++id) {
      if (!bitmask_test(mask, id)) continue;
      const uint64_t score = std::hash<uint64_t>{}(seed * 1000003 + static_cast<uint64_t>(step) * 65537 + static_cast<uint64_t>(id)) | 1;
      if (score > top) top = score, pick = id;
    }
    return pick;
  };
  WalkResult r;
  GrammarMatcher m(g);
  for (int step = 0; step < 400 && static_cast<int64_t>(r.tokens.size()) < budget && !m.is_terminated(); ++step) {
    m.fill_next_token_bitmask(mask);
    int32_t pick = best(step);
    REQUIRE(pick >= 0);
    const int64_t left = budget - static_cast<int64_t>(r.tokens.size());
    if (!m.fits_after(pick, left - 1)) {
      m.fill_budget_bitmask(mask, left - 1);
      pick = best(step);
      REQUIRE(pick >= 0);  // these walks start with a budget that fits
    }
    REQUIRE(m.accept_token(pick));
    r.tokens.push_back(pick);
    if (m.ended()) break;
  }
  r.complete = m.can_end();
  return r;
}

}  // namespace

TEST_CASE("budget walks: complete within the budget, exactly at the fewest, unchanged with room") {
  std::ifstream in(std::filesystem::path(FP8SERVE_FIXTURES_DIR) / "grammar" / "schemas.json");
  const Json cases = Json::parse(in);
  // The mask tests' vocabulary: every byte, and pieces of JSON texts up to 6 bytes.
  const auto vocab = synthetic_vocab();
  int same = 0, tight = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto g = compile(cases[c]["schema"], vocab);
    INFO(cases[c]["name"].get<std::string>());
    for (uint64_t seed = 0; seed < 3; ++seed) {
      const WalkResult free = walk(g, seed, kNoBudget);
      if (!free.complete) continue;
      const auto n = static_cast<int64_t>(free.tokens.size());
      for (const int64_t budget : {n, n + 1, n + 5}) {
        const WalkResult with = walk(g, seed, budget);
        CHECK(with.tokens == free.tokens);
        same += with.tokens == free.tokens;
      }
      GrammarMatcher start(g);
      const int64_t fewest = start.tokens_to_end(1000);
      for (const int64_t budget : {fewest, fewest + 3, n / 2}) {
        if (budget < fewest) continue;
        const WalkResult closed = walk(g, seed, budget);
        CHECK(closed.complete);
        CHECK(static_cast<int64_t>(closed.tokens.size()) <= budget);
        if (budget == fewest) CHECK(static_cast<int64_t>(closed.tokens.size()) == fewest);
        ++tight;
      }
    }
    CHECK(g->closing_graph().stats().gave_up == 0);  // every answer settled, so all of the above is exact
  }
  CHECK(same > 100);
  CHECK(tight > 100);
}

TEST_CASE("the first token: SentencePiece's variant without its space counts as what it writes there") {
  // A vocabulary whose " {\"name\":\"" writes {"name":" as the first token of a text.
  std::vector<std::string> bytes;
  for (int32_t id = 0; id < small_vocab()->mask_size(); ++id)
    bytes.emplace_back(small_vocab()->usable(id) ? std::string(small_vocab()->bytes(id)) : std::string("<eos>"));
  const auto eos = small_vocab()->end_tokens().front();
  const auto variant = static_cast<int32_t>(bytes.size());
  bytes.push_back(" {\"name\":\"");
  std::vector<uint8_t> usable(bytes.size(), 1);
  for (size_t id = 0; id < usable.size(); ++id) usable[id] = small_vocab()->usable(static_cast<int32_t>(id)) || id == static_cast<size_t>(variant);
  auto vocab = std::make_shared<TokenVocabulary>(bytes, usable, std::vector<int32_t>{eos}, variant + 1);
  vocab->set_first_token_variants({{variant, "{\"name\":\""}});
  const auto g = compile(Json::parse(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                                         "required": ["name", "age"], "additionalProperties": false})"),
                         vocab);
  GrammarMatcher m(g);
  int32_t brace = -1;
  for (int32_t id = 0; id < variant; ++id)
    if (vocab->usable(id) && vocab->bytes(id) == "{") brace = id;
  REQUIRE(brace >= 0);
  // {"name":" "," age ": 0 } in six tokens with the variant; seven without ({ "name":" ...).
  CHECK(m.fits_after(variant, 5));
  CHECK_FALSE(m.fits_after(brace, 5));
  CHECK(m.fits_after(brace, 6));
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->mask_words()));
  CHECK(m.fill_budget_bitmask(mask, 5));
  CHECK(bitmask_test(mask, variant));
  CHECK_FALSE(bitmask_test(mask, brace));
  REQUIRE(m.accept_token(variant));
  CHECK(m.tokens_to_end(10) == 5);
  // Past the first token it writes its usual bytes again, which do not continue the text here.
  CHECK_FALSE(m.fits_after(variant, 100));
}
