// AsyncEngine: the engine on its own thread, fed from several client threads at once.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine_test_util.hpp"
#include "server/async_engine.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

// Outputs from the engine thread, guarded; wait_finished blocks until every choice is done.
struct SharedOutputs {
  std::mutex mutex;
  std::condition_variable done;
  Outputs outputs;
  int num_finished = 0;

  OutputSink sink() {
    return [this](RequestOutput&& out) {
      std::lock_guard<std::mutex> lock(mutex);
      const bool finished = out.finish.has_value();
      collect(outputs)(std::move(out));
      if (finished) {
        ++num_finished;
        done.notify_all();
      }
    };
  }
  bool wait_finished(int n) {
    std::unique_lock<std::mutex> lock(mutex);
    return done.wait_for(lock, std::chrono::seconds(60), [&] { return num_finished >= n; });
  }
};

std::vector<int32_t> prompt(int i) {
  const nlohmann::json ref = load_reference("tiny-qwen3");
  auto ids = ids_of(ref["prompts"][static_cast<std::size_t>(i % 4)]["prompt_ids"]);
  ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(5 + 7 * i)));
  return ids;
}

}  // namespace

TEST_CASE("AsyncEngine: concurrent submits give the same outputs as the engine run directly", "[engine][async]") {
  const int num_requests = 12;
  const EngineOptions options = small_options(KvDtype::fp8_e4m3);
  auto direct = make_engine(fixture("models/tiny-qwen3"), options);
  Outputs expected;
  for (int i = 0; i < num_requests; ++i)
    direct->add_request(greedy_request(std::to_string(i), prompt(i), 12), collect(expected));
  run_to_completion(*direct);

  AsyncEngine async(make_engine(fixture("models/tiny-qwen3"), options));
  async.start();
  SharedOutputs shared;
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      for (int i = t; i < num_requests; i += 3) async.submit(greedy_request(std::to_string(i), prompt(i), 12), shared.sink());
    });
  }
  for (std::thread& c : clients) c.join();
  REQUIRE(shared.wait_finished(num_requests));
  async.drain();
  for (int i = 0; i < num_requests; ++i) {
    // Greedy outputs are batch invariant, so the interleaving of submissions does not matter.
    CHECK(shared.outputs.at(std::to_string(i)).at(0).tokens == expected.at(std::to_string(i)).at(0).tokens);
  }
  const EngineStats stats = async.stats();
  CHECK(stats.num_running == 0);
  CHECK(stats.num_waiting == 0);
  CHECK(stats.kv_usage == 0.0);
  CHECK(stats.saturated_per_layer.size() == 3);
}

TEST_CASE("AsyncEngine: abort, drain refuses new work, stop ends what is left", "[engine][async]") {
  AsyncEngine async(make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16)));
  async.start();
  SharedOutputs shared;
  async.submit(greedy_request("long", prompt(3), 400), shared.sink());
  async.abort("long");
  REQUIRE(shared.wait_finished(1));
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    CHECK(shared.outputs.at("long").at(0).finish == FinishReason::abort);
  }
  async.submit(greedy_request("short", prompt(1), 3), shared.sink());
  async.drain();  // waits for "short"
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    CHECK(shared.outputs.at("short").at(0).finish == FinishReason::length);
  }
  async.submit(greedy_request("late", prompt(1), 3), shared.sink());
  REQUIRE(shared.wait_finished(3));
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    CHECK(shared.outputs.at("late").at(0).finish == FinishReason::error);
  }
  async.stop();
  async.stop();  // idempotent
}

TEST_CASE("AsyncEngine: stop() aborts running requests so no client waits forever", "[engine][async]") {
  auto async = std::make_unique<AsyncEngine>(make_engine(fixture("models/tiny-qwen3"), small_options(KvDtype::bf16)));
  async->start();
  SharedOutputs shared;
  for (int i = 0; i < 4; ++i) async->submit(greedy_request(std::to_string(i), prompt(i), 400), shared.sink());
  async.reset();  // the destructor stops
  std::lock_guard<std::mutex> lock(shared.mutex);
  CHECK(shared.num_finished == 4);
  for (const auto& [id, choices] : shared.outputs) CHECK(choices.at(0).finish.has_value());
}
