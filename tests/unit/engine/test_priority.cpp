// --scheduling-policy priority through the whole engine (scheduler, block manager, transformer,
// CPU kernels): an urgent request that finds the seats or the pool taken preempts less urgent
// running requests and starts in the same step, and every output - the urgent one's and the
// preempted ones', recomputed from their tokens with their frozen scales - is bit for bit what
// the request gives alone in a fresh engine, with and without the bf16 window and prefix caching.
#include <catch2/catch.hpp>

#include <algorithm>

#include "engine_test_access.hpp"
#include "engine_test_util.hpp"

namespace fp8serve::test {

namespace {

GenerationRequest with_priority(GenerationRequest r, int priority) {
  r.priority = priority;
  return r;
}

int running_at(const Engine& engine, int priority) {
  for (const EngineStats::PriorityClass& c : engine.stats().by_priority)
    if (c.priority == priority) return c.num_running;
  return 0;
}

}  // namespace

TEST_CASE("priority: an urgent request preempts less urgent ones at once; every output is its output alone", "[engine][priority]") {
  const auto prompts = eight_prompts();
  constexpr uint64_t kBlockBytes = 2u * 2 * 2 * 16 * 16;  // tiny-llama, FP8: layers x (K, V) x KV heads x dims x 16 tokens
  constexpr int kLow = 48, kUrgent = 24;                    // tokens each generates
  int low_blocks = 0;  // the three low requests, whole
  for (int i = 0; i < 3; ++i) low_blocks += (static_cast<int>(prompts[static_cast<std::size_t>(i)].size()) + kLow + 15) / 16;
  struct Case {
    const char* name;
    int max_num_seqs;
    bool pool;  // the pool holds the three low requests and no more: the urgent one needs their blocks
    int window;
    bool prefix_caching;
  };
  for (const Case c : {Case{"seats", 3, false, 0, false}, Case{"seats, window, prefix cache", 3, false, 16, true},
                       Case{"pool", 8, true, 0, false}, Case{"pool, prefix cache", 8, true, 0, true}}) {
    INFO(c.name);
    EngineOptions options = small_options(KvDtype::fp8_e4m3);
    options.priority_scheduling = true;
    options.max_num_seqs = c.max_num_seqs;
    options.kv_bf16_window = c.window;
    options.enable_prefix_caching = c.prefix_caching;
    std::vector<int32_t> urgent = prompts[4];
    if (c.pool) {
      options.kv_cache_memory = static_cast<uint64_t>(low_blocks) * kBlockBytes;
      // Most of the pool: more than the low requests leave free, so they are preempted for it.
      urgent.clear();
      for (std::size_t i = 4; i < 8; ++i) urgent.insert(urgent.end(), prompts[i].begin(), prompts[i].end());
      urgent.resize(static_cast<std::size_t>(std::min(low_blocks * 16 - kUrgent - 16, options.max_model_len - kUrgent)));
    }
    auto engine = make_engine(fixture("models/tiny-llama"), options);
    Outputs out;
    // Three less urgent requests (priority 7) take the seats, or the pool.
    for (int i = 0; i < 3; ++i)
      engine->add_request(with_priority(greedy_request("low" + std::to_string(i), prompts[static_cast<std::size_t>(i)], kLow), 7),
                          collect(out));
    for (int step = 0; step < 6; ++step) engine->step();
    REQUIRE(running_at(*engine, 7) == 3);
    REQUIRE(engine->stats().num_preemptions == 0);
    // The urgent one (priority -1) runs in the next step.
    engine->add_request(with_priority(greedy_request("urgent", urgent, kUrgent), -1), collect(out));
    engine->step();
    CHECK(running_at(*engine, -1) == 1);
    CHECK(engine->stats().num_preemptions > 0);
    EngineTestAccess::check_integrity(*engine);
    run_to_completion(*engine);
    CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
    for (int i = 0; i < 4; ++i) {
      const std::string id = i < 3 ? "low" + std::to_string(i) : "urgent";
      INFO(id);
      const Choice alone = run_alone(fixture("models/tiny-llama"), options, i < 3 ? prompts[static_cast<std::size_t>(i)] : urgent,
                                     i < 3 ? kLow : kUrgent);
      const Choice& got = out.at(id).at(0);
      CHECK(got.tokens == alone.tokens);
      CHECK(got.logprobs == alone.logprobs);
    }
  }
}

TEST_CASE("priority: first come, first served ignores it; the stats show the classes only under the policy", "[engine][priority]") {
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.max_num_seqs = 1;
  auto engine = make_engine(fixture("models/tiny-llama"), options);
  Outputs out;
  engine->add_request(with_priority(greedy_request("first", eight_prompts()[0], 4), 9), collect(out));
  engine->add_request(with_priority(greedy_request("second", eight_prompts()[1], 4), -9), collect(out));
  engine->step();
  CHECK(engine->stats().by_priority.empty());
  CHECK(out.count("first") == 1);  // arrival order, whatever the priority
  CHECK(out.count("second") == 0);
  run_to_completion(*engine);
  CHECK(engine->stats().num_preemptions == 0);
  CHECK(out.at("first").at(0).finish.has_value());
}

}  // namespace fp8serve::test
