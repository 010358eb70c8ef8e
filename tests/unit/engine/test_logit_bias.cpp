// logit_bias and allowed_token_ids through the whole engine against transformers: with the bf16
// pool the greedy token of each reference prompt is the reference's argmax; a -100 bias on it
// must give the reference's second-best token, on both it the third-best, a +100 bias any
// chosen token, and allowed_token_ids the best of the allowed (top-k ids of the reference's
// last-position logits, tests/fixtures/engine/*.kv-bf16.json).
#include "engine_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

// The first token of one greedy request with these sampling extras.
SampleResult first_token(Engine& engine, const std::vector<int32_t>& prompt, const SamplingParams& extras) {
  Outputs outputs;
  GenerationRequest r = greedy_request("r", prompt, 1);
  r.sampling.logit_bias = extras.logit_bias;
  r.sampling.allowed_token_ids = extras.allowed_token_ids;
  r.sampling.num_logprobs = 3;
  SampleResult result;
  engine.add_request(r, [&](RequestOutput&& out) {
    if (!out.logprobs.empty()) result = out.logprobs[0];
    REQUIRE(out.error.empty());
  });
  run_to_completion(engine);
  return result;
}

}  // namespace

TEST_CASE("logit_bias through the engine: -100 bans the argmax, the next is transformers' second best", "[engine]") {
  const nlohmann::json ref = load_kv_bf16_reference("tiny-qwen3");
  EngineOptions options = small_options(KvDtype::bf16);
  auto engine = make_engine(fixture("models/tiny-qwen3"), options);
  int checked = 0;
  for (const auto& prompt : ref["prompts"]) {
    INFO(prompt["name"].get<std::string>());
    const auto prompt_ids = ids_of(prompt["prompt_ids"]);
    const auto top = ids_of(prompt["last_logits"]["top_ids"]);
    const auto values = prompt["last_logits"]["top_values"].get<std::vector<double>>();
    // Only where the reference's ranks are clear of bf16 noise (margins > 0.02).
    const bool clear = values[0] - values[1] > 0.02 && values[1] - values[2] > 0.02 && values[2] - values[3] > 0.02;
    SamplingParams extras;
    const SampleResult plain = first_token(*engine, prompt_ids, extras);
    CHECK(plain.token == top[0]);
    extras.logit_bias = {{top[0], -100.0f}};
    const SampleResult banned = first_token(*engine, prompt_ids, extras);
    if (clear) CHECK(banned.token == top[1]);
    // Reported logprobs are the unbiased model's: the same top list as without the bias.
    CHECK(banned.top_logprobs.at(0).token == plain.top_logprobs.at(0).token);
    CHECK(banned.logprob == plain.top_logprobs.at(1).logprob);
    extras.logit_bias = {{top[0], -100.0f}, {top[1], -100.0f}};
    if (clear) CHECK(first_token(*engine, prompt_ids, extras).token == top[2]);
    extras.logit_bias = {{top[19], 100.0f}};
    CHECK(first_token(*engine, prompt_ids, extras).token == top[19]);
    extras.logit_bias = {};
    extras.allowed_token_ids = {top[5], top[3], top[9]};
    if (clear) CHECK(first_token(*engine, prompt_ids, extras).token == top[3]);
    checked += clear ? 1 : 0;
  }
  CHECK(checked >= 2);
  // An id outside the vocabulary is refused by the engine too (the front end checks first).
  Outputs outputs;
  GenerationRequest bad = greedy_request("bad", {1, 2}, 1);
  bad.sampling.logit_bias = {{engine->model_config().vocab_size, 1.0f}};
  engine->add_request(bad, collect(outputs));
  CHECK(outputs["bad"][0].finish == FinishReason::error);
  CHECK(outputs["bad"][0].error.find("logit_bias") != std::string::npos);
}
