#pragma once
// A scripted stand-in for the engine, for the HTTP layer's unit tests only (the integration
// tests drive the real engine): each request "generates" its prompt tokens back, one output
// per token, on a thread of its own; with `hold` set it produces nothing until aborted.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/api/engine_client.hpp"

namespace fp8serve::test {

class FakeEngine : public EngineClient {
 public:
  ~FakeEngine() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void submit(GenerationRequest request, OutputSink sink) override {
    std::lock_guard lock(mutex_);
    submitted_.push_back(request);
    threads_.emplace_back([this, request = std::move(request), sink = std::move(sink)] { run(request, sink); });
  }

  void abort(const std::string& request_id) override {
    {
      std::lock_guard lock(mutex_);
      aborted_.insert(request_id);
    }
    cv_.notify_all();
  }

  EngineStats stats() const override {
    EngineStats s;
    s.num_running = running_.load();
    return s;
  }

  void reset_prefix_cache() override { ++resets; }

  bool hold = false;
  std::atomic<int> resets{0};
  std::atomic<int> running_{0};

  std::vector<GenerationRequest> submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  bool was_aborted(const std::string& id) {
    std::lock_guard lock(mutex_);
    return aborted_.count(id) > 0;
  }
  bool wait_aborted(const std::string& id, int timeout_ms) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return aborted_.count(id) > 0; });
  }

 private:
  void run(const GenerationRequest& r, const OutputSink& sink) {
    ++running_;
    if (hold) {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || aborted_.count(r.request_id) > 0; });
      --running_;
      return;
    }
    const int count = std::min<int>(r.max_tokens, static_cast<int>(r.prompt_tokens.size()));
    for (int choice = 0; choice < r.n; ++choice) {
      for (int i = 0; i < count; ++i) {
        RequestOutput o;
        o.request_id = r.request_id;
        o.index = choice;
        o.new_tokens = {r.prompt_tokens[static_cast<size_t>(i)]};
        o.text_delta.append("<").append(std::to_string(r.prompt_tokens[static_cast<size_t>(i)])).append(">");
        o.prompt_tokens = static_cast<int>(r.prompt_tokens.size());
        o.completion_tokens = i + 1;
        if (i + 1 == count) o.finish = count == r.max_tokens ? FinishReason::length : FinishReason::stop;
        sink(std::move(o));
      }
    }
    --running_;
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::vector<GenerationRequest> submitted_;
  std::set<std::string> aborted_;
};

}  // namespace fp8serve::test
