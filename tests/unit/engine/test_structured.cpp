// Structured outputs in the engine: the grammar's mask is applied before every sampling mode
// (greedy, temperature with top-k / top-p / min-p, penalties, n > 1), and a sequence ends as
// soon as its JSON is complete. The fixture model has random weights, so without the mask it
// would write anything: every output here must still be a complete, valid document.
#include <nlohmann/json.hpp>

#include "engine_test_util.hpp"
#include "server/grammar/json_schema.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

const char* kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": -5, "maximum": 99},
    "ok": {"type": "boolean"}, "tag": {"enum": ["alpha", "beta", "gamma"]},
    "xs": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 3}},
    "required": ["name", "n", "ok", "tag"], "additionalProperties": false})";

// Checks a document against kSchema by hand (nlohmann parses it; the rules are re-stated here).
void check_document(const std::string& text) {
  INFO(text);
  const nlohmann::json doc = nlohmann::json::parse(text);
  REQUIRE(doc.is_object());
  REQUIRE(doc.at("name").is_string());
  CHECK(doc["name"].get<std::string>().size() <= 8 * 4);  // at most 8 characters
  REQUIRE(doc.at("n").is_number_integer());
  CHECK(doc["n"].get<int>() >= -5);
  CHECK(doc["n"].get<int>() <= 99);
  CHECK(doc.at("ok").is_boolean());
  const std::string tag = doc.at("tag").get<std::string>();
  CHECK((tag == "alpha" || tag == "beta" || tag == "gamma"));
  for (const auto& [key, value] : doc.items()) CHECK((key == "name" || key == "n" || key == "ok" || key == "tag" || key == "xs"));
  if (doc.contains("xs")) {
    CHECK(doc["xs"].size() <= 3);
    for (const auto& x : doc["xs"]) CHECK((x.get<double>() >= 0 && x.get<double>() <= 1));
  }
}

// kSchema compiled for the engine's vocabulary.
std::shared_ptr<const grammar::CompiledGrammar> compile_for(const Engine& engine) {
  const auto vocab = grammar::TokenVocabulary::from_tokenizer(engine.tokenizer(), engine.model_config().vocab_size,
                                                              engine.stop_token_ids());
  return std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(nlohmann::ordered_json::parse(kSchema)),
                                                          vocab);
}

}  // namespace

TEST_CASE("constrained decoding: every sampling mode ends in a valid document", "[engine][structured]") {
  auto engine = make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16));
  const auto compiled = compile_for(*engine);
  const std::vector<int32_t> prompt = engine->tokenizer().encode("Describe an item as JSON:", false);

  struct Mode {
    const char* name;
    SamplingParams params;
    int n;
    bool ignore_eos;
  };
  std::vector<Mode> modes;
  modes.push_back({"greedy", {}, 1, true});
  modes.back().params.temperature = 0;
  modes.push_back({"temperature", {}, 3, false});
  modes.back().params.temperature = 1.3f;
  modes.push_back({"top-k top-p", {}, 2, false});
  modes.back().params.top_k = 5, modes.back().params.top_p = 0.8f;
  modes.push_back({"min-p and penalties", {}, 2, true});
  modes.back().params.min_p = 0.2f, modes.back().params.presence_penalty = 1.5f, modes.back().params.frequency_penalty = 1.0f,
      modes.back().params.repetition_penalty = 1.3f;

  Outputs outputs;
  int k = 0;
  for (const Mode& m : modes) {
    GenerationRequest r;
    r.request_id = m.name;
    r.prompt_tokens = prompt;
    r.sampling = m.params;
    r.sampling.seed = 100 + static_cast<uint64_t>(k++);
    r.max_tokens = 400;
    r.n = m.n;
    r.ignore_eos = m.ignore_eos;
    r.grammar = compiled;
    engine->add_request(r, collect(outputs));
  }
  run_to_completion(*engine);
  REQUIRE(engine->grammar_mask_count() > 0);
  for (const Mode& m : modes) {
    INFO(m.name);
    REQUIRE(static_cast<int>(outputs[m.name].size()) == m.n);
    for (const auto& [index, choice] : outputs[m.name]) {
      REQUIRE(choice.finish == FinishReason::stop);  // ended by the grammar, never by length
      check_document(choice.text);
      CHECK(choice.text.front() == '{');
      CHECK(choice.text.back() == '}');  // nothing after the document
    }
  }
  CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
}

TEST_CASE("constrained decoding: below the fewest tokens, the model's own tokens, cut by the length", "[engine][structured]") {
  auto engine = make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16));
  const auto compiled = compile_for(*engine);
  grammar::GrammarMatcher start(compiled);
  REQUIRE(start.tokens_to_end(1000) > 3);  // no complete document fits in 3 tokens
  Outputs outputs;
  for (const int max_tokens : {3, 400}) {
    GenerationRequest r = greedy_request("short" + std::to_string(max_tokens), engine->tokenizer().encode("JSON:", false), max_tokens);
    r.grammar = compiled;
    engine->add_request(r, collect(outputs));
  }
  run_to_completion(*engine);
  const Choice& c = outputs["short3"][0];
  CHECK(c.finish == FinishReason::length);
  REQUIRE(c.tokens.size() == 3);
  const std::vector<int32_t>& free = outputs["short400"][0].tokens;
  REQUIRE(free.size() > 3);
  CHECK(std::vector<int32_t>(free.begin(), free.begin() + 3) == c.tokens);  // not closed early, not spelled out
  CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
}

TEST_CASE("constrained decoding: a tight max_tokens still ends in a complete document", "[engine][structured]") {
  auto engine = make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16));
  const auto compiled = compile_for(*engine);
  grammar::GrammarMatcher start(compiled);
  const int64_t fewest = start.tokens_to_end(1000);
  REQUIRE(fewest > 5);
  CHECK(fewest < start.bytes_to_end());  // the vocabulary's multi-byte tokens close it sooner
  Outputs outputs;
  for (int extra : {0, 1, 5, 20}) {
    GenerationRequest r;
    r.request_id = "tight" + std::to_string(extra);
    r.prompt_tokens = engine->tokenizer().encode("JSON:", false);
    r.sampling.temperature = 1.5f;  // a wandering sampler: the budget, not the model, must close it
    r.sampling.seed = static_cast<uint64_t>(extra);
    r.max_tokens = static_cast<int>(fewest) + extra;
    r.n = 2;
    r.grammar = compiled;
    engine->add_request(r, collect(outputs));
  }
  run_to_completion(*engine);
  for (const auto& [id, choices] : outputs)
    for (const auto& [index, choice] : choices) {
      INFO(id << " " << choice.text);
      check_document(choice.text);
      CHECK(choice.finish == FinishReason::stop);  // complete: a finished document, whatever ended it
      CHECK(choice.tokens.size() <= static_cast<size_t>(fewest + 20));
    }
  for (const auto& [index, choice] : outputs["tight0"]) CHECK(choice.tokens.size() == static_cast<size_t>(fewest));
  CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
}

TEST_CASE("constrained decoding: with room in max_tokens, the output is the one without a limit", "[engine][structured]") {
  auto engine = make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16));
  const auto compiled = compile_for(*engine);
  Outputs outputs;
  auto request = [&](const std::string& id, int max_tokens, uint64_t seed) {
    GenerationRequest r;
    r.request_id = id;
    r.prompt_tokens = engine->tokenizer().encode("An item:", false);
    r.sampling.temperature = 0.8f;  // sampled, with a seed: the same draws while nothing is refused
    r.sampling.seed = seed;
    r.max_tokens = max_tokens;
    r.grammar = compiled;
    engine->add_request(r, collect(outputs));
  };
  for (uint64_t seed = 0; seed < 4; ++seed) request("free" + std::to_string(seed), 400, seed);
  run_to_completion(*engine);
  int compared = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const Choice& free = outputs["free" + std::to_string(seed)][0];
    if (free.finish != FinishReason::stop) continue;  // looped until the limit
    const int n = static_cast<int>(free.tokens.size());
    for (const int extra : {0, 1, 5}) request("s" + std::to_string(seed) + "+" + std::to_string(extra), n + extra, seed);
    ++compared;
  }
  REQUIRE(compared >= 2);
  run_to_completion(*engine);
  for (const auto& [id, choices] : outputs) {
    if (id[0] != 's') continue;
    const Choice& free = outputs["free" + id.substr(1, id.find('+') - 1)][0];
    INFO(id);
    CHECK(choices.at(0).tokens == free.tokens);
    CHECK(choices.at(0).finish == FinishReason::stop);
  }
}
