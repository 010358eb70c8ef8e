// [gpu] Structured outputs sampled on the device (--device cuda): the grammar's bitmask joins the
// row's logit processing (process_logits), the device picks the token (greedy) or its top-k
// candidates (the host's seeded draw), and the host checks the token budget, resampling the
// downloaded row when the document could not end in time. Against the same engine with device
// sampling off (every row's logits to the host, masked and sampled there): the same tokens and
// text for every sampling mode, and complete documents under a tight max_tokens. In CI on the
// emulated H200 (CTest test_structured_cuda_emu), on a GPU in test_engine.
#include "tests/unit/engine/engine_test_access.hpp"
#include "tests/unit/engine/engine_test_util.hpp"

#include <nlohmann/json.hpp>

#include "server/grammar/json_schema.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

const char* kSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tag": {"enum": ["alpha", "beta"]}}, "required": ["name", "n", "tag"], "additionalProperties": false})";

std::shared_ptr<const grammar::CompiledGrammar> compile_for(const Engine& engine) {
  const auto vocab = grammar::TokenVocabulary::from_tokenizer(engine.tokenizer(), engine.model_config().vocab_size,
                                                              engine.stop_token_ids());
  return std::make_shared<const grammar::CompiledGrammar>(grammar::json_schema_grammar(nlohmann::ordered_json::parse(kSchema)),
                                                          vocab);
}

// Every request of `modes` (one choice each) through an engine on CUDA, device sampling on or off.
Outputs run(bool device_sampling, const std::vector<GenerationRequest>& requests) {
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.device = "cuda";
  options.max_num_seqs = 8;
  options.lazy_graph_capture = true;  // the emulator is slow: only the buckets the run uses
  auto engine = make_engine(fixture("models/tiny-qwen3"), options);
  if (!device_sampling) EngineTestAccess::sample_on_host(*engine);
  const auto compiled = compile_for(*engine);
  Outputs outputs;
  for (GenerationRequest r : requests) {
    r.prompt_tokens = engine->tokenizer().encode("JSON:", false);
    r.grammar = compiled;
    engine->add_request(r, collect(outputs));
  }
  run_to_completion(*engine);
  CHECK(engine->grammar_mask_count() > 0);
  CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
  return outputs;
}

}  // namespace

TEST_CASE("structured outputs sampled on the device: the host sampler's tokens, complete documents", "[gpu][structured]") {
  if (!have_cuda_device()) return;
  std::vector<GenerationRequest> requests;
  auto add = [&](const std::string& id, float temperature, int max_tokens) -> SamplingParams& {
    GenerationRequest r;
    r.request_id = id;
    r.sampling.temperature = temperature;
    r.sampling.seed = 7 + requests.size();
    r.max_tokens = max_tokens;
    requests.push_back(r);
    return requests.back().sampling;
  };
  add("greedy", 0.0f, 200);
  add("temperature", 1.3f, 200);
  SamplingParams& topk = add("top-k top-p", 1.0f, 200);
  topk.top_k = 5, topk.top_p = 0.8f;
  SamplingParams& penalties = add("min-p and penalties", 1.0f, 200);  // processors on the device too
  penalties.min_p = 0.2f, penalties.presence_penalty = 1.5f, penalties.repetition_penalty = 1.3f;
  add("tight", 1.5f, 14);  // a wandering sampler under a tight budget: resampled rows

  const Outputs host = run(false, requests);
  const Outputs device = run(true, requests);
  for (const GenerationRequest& r : requests) {
    const Choice& want = host.at(r.request_id).at(0);
    const Choice& got = device.at(r.request_id).at(0);
    INFO(r.request_id << ": " << want.text);
    CHECK(got.tokens == want.tokens);
    CHECK(got.text == want.text);
    CHECK(got.finish == want.finish);
    if (want.finish == FinishReason::stop) CHECK(nlohmann::json::parse(got.text).is_object());
  }
}
