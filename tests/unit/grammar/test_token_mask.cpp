// Token masks against brute force: every token's bit must equal "a copy of the matcher accepts
// this token" — on a synthetic vocabulary of multi-byte tokens that span grammar symbols and
// cut UTF-8 characters, with random walks through several grammars.
#include <catch2/catch.hpp>

#include <random>

#include "grammar_test_util.hpp"

using namespace fp8serve::grammar;
using namespace fp8serve::grammar::test;

namespace {

void check_walks(const std::shared_ptr<const CompiledGrammar>& g, int walks, uint64_t seed) {
  const TokenVocabulary& vocab = g->vocab();
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask(static_cast<size_t>(vocab.mask_words()));
  int completed = 0;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(g);
    for (int step = 0; step < 400 && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab.mask_size(); ++id) {
        GrammarMatcher copy = m;
        const bool brute = id < static_cast<int32_t>(vocab.mask_size()) && copy.accept_token(id);
        INFO("token " << id << " '" << (id < static_cast<int32_t>(vocab.sorted_tokens().size() + 10) && vocab.usable(id) ? std::string(vocab.bytes(id)) : "") << "'");
        REQUIRE(bitmask_test(mask, id) == brute);
        if (brute) allowed.push_back(id);
      }
      REQUIRE_FALSE(allowed.empty());  // a trimmed grammar never strands the matcher
      // Prefer short tokens and the end token now and then, so walks finish.
      int32_t pick = allowed[rng() % allowed.size()];
      if (rng() % 2) {
        std::vector<int32_t> short_ones;
        for (int32_t id : allowed)
          if (vocab.is_end_token(id) || vocab.bytes(id).size() == 1) short_ones.push_back(id);
        if (!short_ones.empty()) pick = short_ones[rng() % short_ones.size()];
      }
      REQUIRE(m.accept_token(pick));
    }
    if (m.is_terminated()) ++completed;
  }
  CHECK(completed > 0);
}

}  // namespace

TEST_CASE("masks equal brute force on a vocabulary of tokens spanning symbols and characters") {
  const auto vocab = synthetic_vocab();
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0},
          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}, "ok": {"type": "boolean"}}, "required": ["name"]})",
      R"({"type": "object"})",
      R"({"anyOf": [{"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
                    {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]}, {"type": "number"}]})",
      R"({"type": "string", "format": "date-time"})",
      R"({"$defs": {"t": {"type": "object", "properties": {"v": {"type": "number", "maximum": 10},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}, "required": ["v"]}}, "$ref": "#/$defs/t"})",
  };
  uint64_t seed = 1;
  for (const std::string& s : schemas) {
    INFO(s);
    check_walks(compile(Json::parse(s), vocab), 6, seed++);
  }
}

TEST_CASE("end tokens only when complete, and never with allow_end_tokens = false") {
  const auto g = compile(Json::parse(R"({"type": "integer"})"), byte_vocab());
  std::vector<uint64_t> mask(static_cast<size_t>(byte_vocab()->mask_words()));
  GrammarMatcher m(g);
  m.fill_next_token_bitmask(mask);
  CHECK_FALSE(bitmask_test(mask, 256));
  REQUIRE(m.accept_token('4'));
  m.fill_next_token_bitmask(mask);
  CHECK(bitmask_test(mask, 256));  // "4" is complete, and may go on ("42")
  CHECK(bitmask_test(mask, '2'));
  CHECK_FALSE(m.is_terminated());
  GrammarMatcher no_end(g, /*allow_end_tokens=*/false);
  REQUIRE(no_end.accept_token('4'));
  no_end.fill_next_token_bitmask(mask);
  CHECK_FALSE(bitmask_test(mask, 256));
  const auto obj = compile(Json::parse(R"({"type": "object", "properties": {}, "additionalProperties": false})"), byte_vocab());
  GrammarMatcher done(obj);
  REQUIRE(done.accept_bytes("{}"));
  CHECK(done.is_terminated());  // nothing may follow a complete object
  done.fill_next_token_bitmask(mask);
  CHECK(bitmask_count(mask) == 1);
  CHECK(done.accept_token(256));
  CHECK(done.ended());
}

TEST_CASE("apply_token_bitmask masks logits to -inf, padding ids included") {
  std::vector<uint64_t> mask(2, 0);
  bitmask_set(mask, 3);
  bitmask_set(mask, 64);
  std::vector<float> logits(70, 1.0f);
  apply_token_bitmask(mask, logits);
  for (size_t i = 0; i < logits.size(); ++i) CHECK((logits[i] == 1.0f) == (i == 3 || i == 64));
}
