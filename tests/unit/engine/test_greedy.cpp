// 32 greedy tokens through the whole engine (scheduler, paged pool, sampler) against
// transformers, for the tiny fixtures and the default model.
//
// With the bf16 pool the tokens must be identical to transformers with bf16-rounded K/V (the
// pool's exact semantics, tests/fixtures/engine/; with the bf16 dot, the same computation with
// every projection's input rounded to bf16 where that reference exists), up to a near-tie of the
// reference (criterion below). Against
// the fp32-K/V reference, and with the FP8 pool, the agreement is printed, not asserted: the
// random tiny models have near-tied logits (margins ~0.01) that FP8's 3 mantissa bits move by
// ~0.5, so FP8 is held to what it must guarantee in test_forward_logits.cpp (no saturation on
// the calibrating prefill, logits close) and measured on the real model by the benchmark.
#include <cstdio>

#include "engine_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

int common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return static_cast<int>(i);
}

// Runs every prompt of the reference file as its own request, all in one engine (they batch).
std::map<std::string, std::vector<int32_t>> run_prompts(Engine& engine, const nlohmann::json& ref, int num_tokens) {
  Outputs outputs;
  for (const auto& prompt : ref["prompts"]) {
    engine.add_request(greedy_request(prompt["name"], ids_of(prompt["prompt_ids"]), num_tokens), collect(outputs));
  }
  run_to_completion(engine);
  std::map<std::string, std::vector<int32_t>> tokens;
  for (const auto& [id, choices] : outputs) {
    REQUIRE(choices.at(0).finish == FinishReason::length);
    tokens[id] = choices.at(0).tokens;
  }
  return tokens;
}

void check_greedy(const std::string& name, const std::string& path, const EngineOptions& base,
                  std::size_t max_prompts = 100) {
  nlohmann::json ref = load_kv_bf16_reference(name);
  while (ref["prompts"].size() > max_prompts) ref["prompts"].erase(ref["prompts"].size() - 1);
  const nlohmann::json ref32 = load_reference(name);
  EngineOptions options = base;
  options.kv_dtype = KvDtype::bf16;
  auto engine = make_engine(path, options);
  const auto bf16 = run_prompts(*engine, ref, 32);
  options.kv_dtype = KvDtype::fp8_e4m3;
  engine = make_engine(path, options);
  const auto fp8 = run_prompts(*engine, ref, 32);
  for (std::size_t p = 0; p < ref["prompts"].size(); ++p) {
    const auto& prompt = ref["prompts"][p];
    const std::string prompt_name = prompt["name"];
    const std::vector<int32_t> expected = ids_of(prompt["greedy_ids"]);
    const std::vector<int32_t>& ours = bf16.at(prompt_name);
    std::printf("[greedy] %-18s %-15s bf16 KV = bf16-K/V transformers: %2d/32, = fp32-K/V transformers: %2d/32, "
                "fp8 KV = bf16 KV: %2d/32\n",
                name.c_str(), prompt_name.c_str(), common_prefix(ours, expected),
                common_prefix(ours, ids_of(ref32["prompts"][p]["greedy_ids"])), common_prefix(fp8.at(prompt_name), ours));
    // Identical, or diverging only at a near-tie of the reference: a step whose top-1 - top-2
    // margin is below 0.01 where our arithmetic is the reference's (the fp32 dot against
    // transformers; the bf16 dot against the *.act-bf16.json references with the same roundings):
    // our fp32 sums run in another order than torch's or numpy's, which moves a logit by ~1e-4
    // (the logits test bounds it), enough to pick the other token of a 0.002 tie. Where the bf16
    // dot meets a reference without its roundings (the default model), below 0.1: its last
    // logits lie within 0.07-0.13 of transformers' (test_forward_logits.cpp), each of the two
    // top logits may move by that much.
    const bool same_roundings = !projections_round_to_bf16() || has_act_bf16_reference(name);
    const int agree = common_prefix(ours, expected);
    if (agree < 32) {
      const double margin = prompt["greedy_steps"][static_cast<std::size_t>(agree)]["margin"];
      INFO("first difference at step " << agree << ", reference margin " << margin);
      CHECK(margin < (same_roundings ? 0.01 : 0.1));
    }
    CHECK(ours.size() == 32);
    CHECK(fp8.at(prompt_name).size() == 32);
  }
}

}  // namespace

TEST_CASE("tiny models: 32 greedy tokens identical to transformers with the bf16 pool", "[engine][greedy]") {
  const EngineOptions options = small_options(KvDtype::bf16);
  check_greedy("tiny-llama", fixture("models/tiny-llama"), options);
  check_greedy("tiny-qwen2", fixture("models/tiny-qwen2"), options);
  check_greedy("tiny-qwen3", fixture("models/tiny-qwen3"), options);
}

TEST_CASE("the GGUF twin and the HF folder of tiny Llama give identical tokens and logprobs", "[engine][greedy]") {
  const nlohmann::json ref = load_kv_bf16_reference("tiny-llama");
  Outputs hf_out, gguf_out;
  auto hf = make_engine(fixture("models/tiny-llama"), small_options(KvDtype::fp8_e4m3));
  auto gguf = make_engine(fixture("models/tiny-llama.gguf"), small_options(KvDtype::fp8_e4m3));
  for (const auto& prompt : ref["prompts"]) {
    hf->add_request(greedy_request(prompt["name"], ids_of(prompt["prompt_ids"]), 32), collect(hf_out));
    gguf->add_request(greedy_request(prompt["name"], ids_of(prompt["prompt_ids"]), 32), collect(gguf_out));
  }
  run_to_completion(*hf);
  run_to_completion(*gguf);
  REQUIRE(hf_out.size() == ref["prompts"].size());
  for (const auto& [id, choices] : hf_out) {
    CHECK(choices.at(0).tokens == gguf_out.at(id).at(0).tokens);
    CHECK(choices.at(0).logprobs == gguf_out.at(id).at(0).logprobs);
  }
}

TEST_CASE("default model (SmolLM2-135M Q4_1 GGUF): 32 greedy tokens identical to transformers", "[engine][greedy][model]") {
  if (!std::filesystem::exists(default_model_path())) {
    WARN("skipped: " << default_model_path() << " is absent (.ci/fetch-model downloads it)");
    return;
  }
  EngineOptions options = small_options(KvDtype::bf16);
  options.kv_cache_memory = 64u << 20;
  options.max_model_len = 1024;
  options.threads = 2;
  // Under ASan (~10x slower) two prompts keep the test short; Release runs all five.
  check_greedy("smollm2-135m-q4_1", default_model_path(), options, kSanitized ? 2 : 100);
}
