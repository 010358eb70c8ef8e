// [gpu] Sampling on the device with --device cuda, end to end: the same requests with device
// sampling on and off give the same tokens and logprobs (greedy picks; seeded draws from the
// prefilter's candidates, whose raw sum is computed only for rows that ask for logprobs; logit
// processors and penalties applied on the device). In CI on the emulated H200 (CTest
// test_sampling_cuda_emu), on a GPU in test_engine (tests/gpu/run.sh).
#include "engine_test_access.hpp"
#include "engine_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

TEST_CASE("the engine on CUDA samples on the device exactly as the host does [gpu]", "[gpu][engine]") {
  if (!have_cuda_device()) return;
  // The same requests on the same GPU, device sampling on and off: the logits are the same, so
  // the tokens must be (greedy picks, and seeded draws from the prefilter's candidates or, where
  // they cannot decide, from the row; logit processors and penalties applied on the device first),
  // and the logprobs (bit for bit by construction; checked to 1e-6).
  std::vector<GenerationRequest> requests;
  auto add = [&](const std::string& id, float temperature, float top_p, int top_k, float min_p, int logprobs) {
    GenerationRequest r = greedy_request(id, {1, 15, 200, 33, 7, 400, 12, 90}, 24);
    r.sampling.temperature = temperature;
    r.sampling.top_p = top_p;
    r.sampling.top_k = top_k;
    r.sampling.min_p = min_p;
    r.sampling.num_logprobs = logprobs;
    r.sampling.seed = 42;
    requests.push_back(r);
  };
  add("greedy", 0.0f, 1.0f, 0, 0.0f, 0);
  add("greedy-top5", 0.0f, 1.0f, 0, 0.0f, 5);
  add("top-p", 0.8f, 0.9f, 0, 0.0f, 0);
  add("top-p-no-logprobs", 0.8f, 0.9f, 0, 0.0f, -1);  // the candidates' raw sum left out
  add("top-k-min-p", 1.0f, 1.0f, 40, 0.05f, 2);
  add("temperature", 1.0f, 1.0f, 0, 0.0f, 0);  // a plain draw: always from the row
  add("prompt-logprobs", 0.7f, 0.9f, 0, 0.0f, 0);  // its prefill step scores rows: sampled on the host
  requests.back().num_prompt_logprobs = 1;
  // Logit processors and penalties (no logprobs: those run on the device, process_logits).
  add("greedy-bias-penalties", 0.0f, 1.0f, 0, 0.0f, -1);
  requests.back().sampling.logit_bias = {{15, 5.0f}, {200, -100.0f}};
  requests.back().sampling.repetition_penalty = 1.3f;
  requests.back().sampling.frequency_penalty = 0.5f;
  requests.back().sampling.presence_penalty = 0.25f;
  add("greedy-allowed", 0.0f, 1.0f, 0, 0.0f, -1);
  requests.back().sampling.allowed_token_ids = {5, 15, 33, 90, 200};
  add("top-p-allowed-min-tokens", 0.9f, 0.95f, 0, 0.0f, -1);
  requests.back().sampling.allowed_token_ids = {2, 5, 15, 33, 90, 200, 311};
  requests.back().sampling.min_tokens = 4;
  requests.back().stop_token_ids = {2, 33};  // with EOS, banned before min_tokens
  add("top-k-penalties", 1.0f, 1.0f, 20, 0.0f, -1);
  requests.back().sampling.frequency_penalty = 1.5f;
  requests.back().sampling.presence_penalty = -0.5f;
  requests.back().sampling.repetition_penalty = 0.9f;
  for (const bool all_greedy : {true, false}) {  // a step of greedy picks, then mixed steps
    std::map<bool, Outputs> runs;
    for (const bool on_device : {true, false}) {
      EngineOptions options = small_options(KvDtype::bf16);
      options.device = "cuda";
      options.kv_cache_memory = 64u << 20;
      auto engine = make_engine(fixture("models/tiny-llama"), options);
      if (!on_device) EngineTestAccess::sample_on_host(*engine);
      for (const GenerationRequest& r : requests)
        if (!all_greedy || r.sampling.temperature == 0.0f) engine->add_request(r, collect(runs[on_device]));
      run_to_completion(*engine);
    }
    REQUIRE(runs[true].size() == runs[false].size());
    for (const auto& [id, choices] : runs[false]) {
      INFO(id);
      const Choice& host = choices.at(0);
      const Choice& device = runs[true].at(id).at(0);
      CHECK(device.tokens == host.tokens);
      REQUIRE(device.logprobs.size() == host.logprobs.size());
      for (std::size_t i = 0; i < host.logprobs.size(); ++i)
        CHECK(std::fabs(device.logprobs[i] - host.logprobs[i]) <= 1e-6f * (1.0f + std::fabs(host.logprobs[i])));
    }
  }
}
