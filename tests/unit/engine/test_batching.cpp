// Continuous batching must not change a request's output: alone, inside a batch of 8 prompts of
// different lengths (prefills mixed with decodes in one step), after preemption in a pool too
// small for everyone, or as one of n forked choices. Compared bitwise: tokens and the logprob
// of every chosen token (a function of the whole logits row).
#include "engine_test_access.hpp"
#include "engine_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

void check_invariance(const std::string& model, KvDtype dtype, bool quantize_fp8 = false,
                      KvRotation rotation = kDefaultKvRotation) {
  const int max_tokens = kSanitized ? 8 : 24;
  EngineOptions options = small_options(dtype);
  options.quantize_fp8 = quantize_fp8;
  options.kv_rotation = rotation;
  const auto prompts = eight_prompts();
  auto engine = make_engine(model, options);
  Outputs batched;
  // Four start first and are decoding when the other four arrive: the later prefills share
  // steps with decodes.
  for (int i = 4; i < 8; ++i) engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(batched));
  engine->step();
  engine->step();
  CHECK(engine->stats().num_running == 4);
  for (int i = 0; i < 4; ++i) engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(batched));
  run_to_completion(*engine);
  for (int i = 0; i < 8; ++i) {
    const Choice alone = run_alone(model, options, prompts[i], max_tokens);
    const Choice& in_batch = batched.at(std::to_string(i)).at(0);
    INFO(model << ": prompt " << i << " (" << prompts[i].size() << " tokens), " << kv_dtype_name(dtype)
               << " pool, --quantization fp8 " << quantize_fp8 << ", --kv-rotation " << kv_rotation_name(rotation));
    CHECK(in_batch.tokens.size() == static_cast<std::size_t>(max_tokens));
    CHECK(in_batch.tokens == alone.tokens);
    CHECK(in_batch.logprobs == alone.logprobs);  // bitwise: same logits rows
  }
}

}  // namespace

TEST_CASE("batch invariance: alone == in a batch of 8 with mixed prefill and decode, bitwise", "[engine][batch]") {
  check_invariance(fixture("models/tiny-llama"), KvDtype::bf16);
  for (const KvRotation rotation : {KvRotation::none, KvRotation::hadamard})
    check_invariance(fixture("models/tiny-qwen3"), KvDtype::fp8_e4m3, false, rotation);
}

TEST_CASE("batch invariance with FP8 weights: quantized at load, and a block-scaled checkpoint", "[engine][batch][fp8]") {
  check_invariance(fixture("models/tiny-llama"), KvDtype::bf16, /*quantize_fp8=*/true);
  check_invariance(fixture("models/tiny-qwen3-fp8-block"), KvDtype::fp8_e4m3);
}

TEST_CASE("preemption in a tiny pool leaves outputs unchanged and returns every block", "[engine][preemption]") {
  const int max_tokens = kSanitized ? 12 : 32;
  const auto prompts = eight_prompts();
  // (dtype, rotation): the bf16 pool, and the FP8 pool with and without --kv-rotation.
  const std::pair<KvDtype, KvRotation> pools[] = {{KvDtype::bf16, KvRotation::none},
                                                  {KvDtype::fp8_e4m3, KvRotation::none},
                                                  {KvDtype::fp8_e4m3, KvRotation::hadamard}};
  for (const auto& [dtype, rotation] : pools) {
    for (const bool prefix_caching : {false, true}) {
      EngineOptions roomy = small_options(dtype);
      roomy.enable_prefix_caching = prefix_caching;
      roomy.kv_rotation = rotation;
      EngineOptions tiny = roomy;
      // 10 blocks of 16 tokens: the longest request (125 + 32 tokens) fits alone, the eight
      // together need ~50 blocks, so running sequences must be preempted and recomputed.
      const uint64_t block_bytes = 2ull * 2 * 2 * 16 * 16 * kv_dtype_size(dtype);  // layers, K+V, kv heads, dim, tokens
      tiny.kv_cache_memory = 10 * block_bytes;
      auto reference = make_engine(fixture("models/tiny-llama"), roomy);
      auto engine = make_engine(fixture("models/tiny-llama"), tiny);
      REQUIRE(engine->block_manager().num_blocks() == 10);
      Outputs expected, got;
      for (int i = 0; i < 8; ++i) {
        reference->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(expected));
        engine->add_request(greedy_request(std::to_string(i), prompts[i], max_tokens), collect(got));
      }
      run_to_completion(*reference);
      for (int step = 0; step < 100000 && engine->has_work(); ++step) {
        engine->step();
        EngineTestAccess::check_integrity(*engine);
      }
      INFO(kv_dtype_name(dtype) << " pool, rotation " << kv_rotation_name(rotation) << ", prefix caching " << prefix_caching);
      REQUIRE_FALSE(engine->has_work());
      const EngineStats stats = engine->stats();
      CHECK(stats.num_preemptions > 0);
      for (int i = 0; i < 8; ++i) {
        CHECK(got.at(std::to_string(i)).at(0).finish == FinishReason::length);
        CHECK(got.at(std::to_string(i)).at(0).tokens == expected.at(std::to_string(i)).at(0).tokens);
      }
      CHECK(engine->block_manager().num_seqs() == 0);
      CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
      CHECK(stats.kv_usage == 0.0);
      CHECK(engine->num_requests() == 0);
    }
  }
}

TEST_CASE("n > 1 greedy choices fork the prompt's blocks and all equal the single greedy output", "[engine][fork]") {
  const auto prompts = eight_prompts();
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    const EngineOptions options = small_options(dtype);
    const Choice single = run_alone(fixture("models/tiny-qwen2"), options, prompts[3], 20);
    auto engine = make_engine(fixture("models/tiny-qwen2"), options);
    GenerationRequest r = greedy_request("n3", prompts[3], 20);  // 40 tokens: a partial last block
    r.n = 3;
    Outputs out;
    engine->add_request(r, collect(out));
    run_to_completion(*engine);
    REQUIRE(out.at("n3").size() == 3);
    for (int i = 0; i < 3; ++i) {
      CHECK(out.at("n3").at(i).tokens == single.tokens);
      CHECK(out.at("n3").at(i).logprobs == single.logprobs);
    }
    CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
  }
}

TEST_CASE("--kv-rotation: a bf16 pool ignores it, an FP8 pool stores rotated heads", "[engine][rotation]") {
  const auto prompts = eight_prompts();
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    EngineOptions none = small_options(dtype);
    none.kv_rotation = KvRotation::none;
    EngineOptions rotated = none;
    rotated.kv_rotation = KvRotation::hadamard;
    const Choice a = run_alone(fixture("models/tiny-qwen3"), none, prompts[5], 16);
    const Choice b = run_alone(fixture("models/tiny-qwen3"), rotated, prompts[5], 16);
    INFO(kv_dtype_name(dtype) << " pool");
    if (dtype == KvDtype::bf16) {
      CHECK(a.tokens == b.tokens);
      CHECK(a.logprobs == b.logprobs);  // bitwise: nothing rotated
    } else {
      CHECK(a.logprobs != b.logprobs);  // FP8 rounds other values
    }
  }
}
