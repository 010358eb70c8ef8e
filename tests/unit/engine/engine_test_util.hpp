#pragma once
// Shared pieces of the engine tests: the transformers reference files, an output collector and
// an engine built from a fixture model.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/loader.hpp"
#include "server/engine.hpp"

namespace fp8serve::test {

// ASan builds run ~10x slower: the tests shorten their loops there, never skip them.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

inline std::string fixture(const std::string& relative) { return std::string(FP8SERVE_FIXTURES_DIR) + "/" + relative; }
inline std::string default_model_path() {
  return std::string(FP8SERVE_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// tests/fixtures/reference/NAME.json: transformers with fp32 K/V.
inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream in(fixture("reference/" + name + ".json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// tests/fixtures/engine/NAME.kv-bf16.json: transformers with K/V rounded to bf16 after RoPE,
// i.e. what fp8serve's bf16 pool stores (tests/scripts/make_engine_reference.py).
inline nlohmann::json load_kv_bf16_reference(const std::string& name) {
  std::ifstream in(fixture("engine/" + name + ".kv-bf16.json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

struct Choice {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each chosen token, when asked for
  std::string text;
  std::optional<FinishReason> finish;
  std::string error;
};

// request id -> choices (index), filled on the engine thread (here: the test's own thread).
using Outputs = std::map<std::string, std::map<int, Choice>>;

inline OutputSink collect(Outputs& outputs) {
  return [&outputs](RequestOutput&& out) {
    Choice& c = outputs[out.request_id][out.index];
    c.tokens.insert(c.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    for (const SampleResult& s : out.logprobs) c.logprobs.push_back(s.logprob);
    c.text += out.text_delta;
    if (out.finish) {
      REQUIRE_FALSE(c.finish.has_value());  // exactly one final output per choice
      c.finish = out.finish;
      c.error = out.error;
    }
  };
}

inline GenerationRequest greedy_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.num_logprobs = 0;  // the chosen token's logprob: a bitwise witness of the logits
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

inline void run_to_completion(Engine& engine, int max_steps = 100000) {
  for (int i = 0; i < max_steps && engine.has_work(); ++i) engine.step();
  REQUIRE_FALSE(engine.has_work());
}

inline EngineOptions small_options(KvDtype dtype) {
  EngineOptions o;
  o.kv_dtype = dtype;
  o.kv_scale_margin = 1.0f;
  o.kv_cache_memory = 4u << 20;
  o.max_model_len = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 512;
  o.enable_prefix_caching = false;
  o.kv_bf16_window = 0;  // the plain FP8 pool; test_bf16_window.cpp runs the window
  o.threads = 2;
  return o;
}

inline std::unique_ptr<Engine> make_engine(const std::string& path, const EngineOptions& options) {
  spdlog::set_level(spdlog::level::warn);
  return std::make_unique<Engine>(load_model(path), options);
}

inline std::vector<int32_t> ids_of(const nlohmann::json& array) { return array.get<std::vector<int32_t>>(); }

// Eight prompts of different lengths (3 to 125 tokens) cut from tiny Llama's fixture prompts.
inline std::vector<std::vector<int32_t>> eight_prompts() {
  const nlohmann::json ref = load_reference("tiny-llama");
  std::vector<int32_t> pool;
  for (const auto& p : ref["prompts"]) {
    const auto ids = ids_of(p["prompt_ids"]);
    pool.insert(pool.end(), ids.begin(), ids.end());
  }
  const int lengths[8] = {125, 3, 17, 40, 64, 90, 110, 7};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    const auto begin = pool.begin() + 11 * i;
    prompts.emplace_back(begin, begin + lengths[i]);
  }
  return prompts;
}

// One greedy request alone in a fresh engine.
inline Choice run_alone(const std::string& model, const EngineOptions& options, const std::vector<int32_t>& prompt,
                        int max_tokens) {
  auto engine = make_engine(model, options);
  Outputs out;
  engine->add_request(greedy_request("alone", prompt, max_tokens), collect(out));
  run_to_completion(*engine);
  return out.at("alone").at(0);
}

}  // namespace fp8serve::test
