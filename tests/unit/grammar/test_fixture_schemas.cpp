// The 50 committed schemas (tests/scripts/make_grammar_schemas.py): each compiles, accepts the
// instances Python's jsonschema accepts (as a model would write them), rejects the ones it
// rejects; and with the real SmolLM2 and Qwen3 vocabularies, the tokenizer's own tokenization
// of every valid instance passes the token masks step by step and ends complete.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "grammar_test_util.hpp"
#include "model/formats/gguf.hpp"
#include "model/tokenizer/tokenizer.hpp"

using namespace fp8serve;
using namespace fp8serve::grammar;
using namespace fp8serve::grammar::test;

namespace {

Json fixture_schemas() {
  std::ifstream in(std::filesystem::path(FP8SERVE_FIXTURES_DIR) / "grammar" / "schemas.json");
  REQUIRE(in);
  return Json::parse(in);
}

struct RealVocab {
  std::string name;
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocab;
};

std::vector<RealVocab> real_vocabs() {
  std::vector<RealVocab> out;
  const std::filesystem::path models = FP8SERVE_MODELS_DIR;
  const auto smol = models / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (std::filesystem::exists(smol)) {
    const GgufFile gguf = GgufFile::open(smol.string());
    auto tok = from_gguf(gguf);
    auto vocab = TokenVocabulary::from_tokenizer(*tok, tok->vocab_size(), {*tok->eos_id()});
    out.push_back({"SmolLM2", std::move(tok), vocab});
  } else {
    WARN("default model absent (" << smol << "): run .ci/fetch-model");
  }
  const auto qwen = models / "qwen3-tokenizer";
  if (std::filesystem::exists(qwen / "tokenizer.json")) {
    auto tok = load_tokenizer_dir(qwen);
    // Qwen3's embedding has 151,936 rows, more than the tokenizer defines: padding ids.
    auto vocab = TokenVocabulary::from_tokenizer(*tok, 151936, {*tok->eos_id()});
    out.push_back({"Qwen3", std::move(tok), vocab});
  } else {
    WARN("Qwen3 tokenizer absent: run tests/scripts/fetch_qwen_tokenizer.py");
  }
  return out;
}

}  // namespace

TEST_CASE("fixture schemas: valid instances accepted, invalid rejected") {
  const Json cases = fixture_schemas();
  REQUIRE(cases.size() == 50);
  for (const Json& c : cases) {
    INFO(c["name"].get<std::string>());
    const auto g = compile(c["schema"]);
    for (const Json& text : c["valid"]) {
      INFO(text.get<std::string>());
      CHECK(accepts(g, text.get<std::string>()));
    }
    for (const Json& text : c["invalid"]) {
      INFO(text.get<std::string>());
      CHECK_FALSE(accepts(g, text.get<std::string>()));
    }
  }
}

TEST_CASE("fixture schemas: real tokenizations of valid instances pass the masks") {
  const Json cases = fixture_schemas();
  for (const RealVocab& rv : real_vocabs()) {
    std::vector<uint64_t> mask(static_cast<size_t>(rv.vocab->mask_words()));
    int64_t steps = 0;
    double seconds = 0;
    for (const Json& c : cases) {
      const auto g = compile(c["schema"], rv.vocab);
      for (const Json& text : c["valid"]) {
        INFO(rv.name << " " << c["name"].get<std::string>() << ": " << text.get<std::string>());
        const std::vector<int32_t> ids = rv.tokenizer->encode(text.get<std::string>(), false);
        GrammarMatcher m(g);
        for (const int32_t id : ids) {
          const auto t0 = std::chrono::steady_clock::now();
          m.fill_next_token_bitmask(mask);
          seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          ++steps;
          INFO("token " << id << " '" << rv.vocab->bytes(id) << "'");
          REQUIRE(bitmask_test(mask, id));
          REQUIRE(m.accept_token(id));
        }
        CHECK(m.can_end());
        m.fill_next_token_bitmask(mask);
        CHECK(bitmask_test(mask, rv.vocab->end_tokens().front()));
      }
    }
    WARN(rv.name << ": " << steps << " masks, " << seconds * 1e6 / static_cast<double>(std::max<int64_t>(steps, 1))
                 << " us per mask (cold caches included)");
  }
}

TEST_CASE("fixture schemas: the closing graph on real vocabularies") {
  // With room in the budget, the budget mask is the token mask: the graph's own walks of the
  // vocabulary find exactly the tokens the cached classifications allow. And the fewest tokens
  // never exceed the tokenizer's own tokenization of a valid instance (a way the masks allow).
  const Json cases = fixture_schemas();
  for (const RealVocab& rv : real_vocabs()) {
    std::vector<uint64_t> mask(static_cast<size_t>(rv.vocab->mask_words())), room(mask.size());
    int64_t compared = 0;
    for (size_t c = 0; c < cases.size(); ++c) {
      const auto g = compile(cases[c]["schema"], rv.vocab);
      for (const Json& text : cases[c]["valid"]) {
        INFO(rv.name << " " << cases[c]["name"].get<std::string>() << ": " << text.get<std::string>());
        const std::vector<int32_t> ids = rv.tokenizer->encode(text.get<std::string>(), false);
        GrammarMatcher m(g);
        CHECK(m.tokens_to_end(1000) <= static_cast<int64_t>(ids.size()));
        if (c % 5 != 0 || &text != &cases[c]["valid"].front()) continue;
        for (const int32_t id : ids) {
          m.fill_next_token_bitmask(mask);
          CHECK(m.fill_budget_bitmask(room, 100000));
          CHECK(room == mask);
          ++compared;
          REQUIRE(m.accept_token(id));
        }
      }
    }
    CHECK(compared > 50);
  }
}
