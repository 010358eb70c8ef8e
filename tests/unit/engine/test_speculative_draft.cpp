// Draft-model speculation (server/engine/draft_model.hpp) must not change a request's output either:
// greedy tokens and logprobs equal plain decoding's bit for bit, whatever the draft proposes,
// with requests joining and leaving and preemption in a tiny pool; and the draft's own blocks
// all return to its pool (its BlockManager's invariants checked after every step). A model
// drafting for itself is the correctness case (every proposal should be accepted, up to the
// rounding of the draft's FP8 cache against the target's); a draft with another vocabulary is
// refused at load.
#include "spec_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

TEST_CASE("draft speculation: tiny-llama drafting for itself, greedy == plain, bitwise, several K", "[engine][spec][draft]") {
  const int max_tokens = kSanitized ? 12 : 40;
  const std::string model = fixture("models/tiny-llama");
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    for (const int k : {1, 4}) {
      EngineOptions options = small_options(dtype);
      options.speculative_model = model;
      const SpecDecodeCounters c = check_spec_equals_plain(model, options, k, max_tokens);
      // The same model, its cache rounded as the target's (FP8: scales calibrated on the same
      // prompt): the draft computes the target's own logits, so every proposal is accepted.
      CHECK(c.num_accepted_tokens == c.num_draft_tokens);
    }
  }
}

TEST_CASE("draft speculation: a draft that disagrees (tiny-llama's FP8 window off) stays exact", "[engine][spec][draft][window]") {
  // The target runs the bf16 window and prefix caching, the draft a pure FP8 cache of its own:
  // its proposals differ from the target's tokens now and then, and those are rejected.
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.kv_bf16_window = 32;
  options.enable_prefix_caching = true;
  options.speculative_model = fixture("models/tiny-llama");
  check_spec_equals_plain(fixture("models/tiny-llama"), options, 3, kSanitized ? 24 : 72);
}

TEST_CASE("draft speculation under preemption in a tiny pool: same output, every block back to both pools", "[engine][spec][draft][preemption]") {
  const int max_tokens = kSanitized ? 12 : 32;
  const std::string model = fixture("models/tiny-llama");
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    EngineOptions roomy = small_options(dtype);
    const auto requests = greedy_requests(spec_prompts(), max_tokens);
    const RunResult plain = run_batch(model, roomy, requests);
    EngineOptions tiny = roomy;
    const uint64_t block_bytes = 2ull * 2 * 2 * 16 * 16 * kv_dtype_size(dtype);  // layers, K+V, kv heads, dim, tokens
    tiny.kv_cache_memory = 24 * block_bytes;  // half for the target (12 blocks), half for the draft
    tiny.num_speculative_tokens = 4;
    tiny.speculative_disable_by_batch_size = 64;
    tiny.speculative_model = model;
    const RunResult spec = run_batch(model, tiny, requests);
    INFO(std::string(kv_dtype_name(dtype)) << " pool");
    CHECK(spec.preemptions > 0);
    CHECK(spec.counters.num_accepted_tokens > 0);
    check_same(plain.outputs, spec.outputs, std::string("draft, preemption, ") + std::string(kv_dtype_name(dtype)));
  }
}

TEST_CASE("draft speculation: the default model drafting for itself, bitwise, acceptance reported", "[engine][spec][draft][default_model]") {
  auto engine = make_engine(default_model_path(), EngineOptions{});
  const std::vector<int32_t> prompt = engine->tokenizer().encode(
      "Write a short story about a lighthouse keeper who finds a message in a bottle.", true);
  const std::vector<int32_t> prompt2 = engine->tokenizer().encode("The three most important inventions of the last century are", true);
  engine.reset();
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    EngineOptions options = small_options(dtype);
    options.kv_cache_memory = 64u << 20;
    const std::vector<GenerationRequest> requests{greedy_request("story", prompt, kSanitized ? 16 : 48),
                                                  greedy_request("list", prompt2, kSanitized ? 16 : 32)};
    const RunResult plain = run_batch(default_model_path(), options, requests);
    options.num_speculative_tokens = 5;
    options.speculative_model = default_model_path();
    const RunResult spec = run_batch(default_model_path(), options, requests);
    check_same(plain.outputs, spec.outputs, std::string("default model drafting for itself, ") + std::string(kv_dtype_name(dtype)));
    const double rate = static_cast<double>(spec.counters.num_accepted_tokens) / std::max<uint64_t>(1, spec.counters.num_draft_tokens);
    std::printf("[spec] default model drafting for itself, %s KV: acceptance %.3f (%llu of %llu) over %llu drafts\n",
                std::string(kv_dtype_name(dtype)).c_str(), rate,
                static_cast<unsigned long long>(spec.counters.num_accepted_tokens),
                static_cast<unsigned long long>(spec.counters.num_draft_tokens),
                static_cast<unsigned long long>(spec.counters.num_drafts));
    CHECK(spec.counters.num_drafts > 0);
    CHECK(rate > 0.9);
  }
}

TEST_CASE("draft speculation: a draft with another vocabulary is refused at load", "[engine][spec][draft]") {
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.num_speculative_tokens = 4;
  options.speculative_model = fixture("models/tiny-qwen2");
  CHECK_THROWS_WITH(make_engine(default_model_path(), options), Catch::Matchers::Contains("vocabulary differs"));
}
