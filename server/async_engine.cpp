#include "server/async_engine.hpp"

#include <algorithm>

namespace fp8serve {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  stats_ = engine_->stats();
}

AsyncEngine::~AsyncEngine() { stop(); }

void AsyncEngine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { loop(); });
}

void AsyncEngine::submit(GenerationRequest request, OutputSink sink) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (accepting_) {
      submissions_.emplace_back(std::move(request), std::move(sink));
      wake_.notify_one();
      return;
    }
  }
  // Shutting down: answer on the caller's thread, the engine will not see it.
  for (int i = 0; i < std::max(1, request.n); ++i) {
    RequestOutput out;
    out.request_id = request.request_id;
    out.index = i;
    out.finish = FinishReason::error;
    out.error = "the server is shutting down";
    sink(std::move(out));
  }
}

void AsyncEngine::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  aborts_.push_back(request_id);
  wake_.notify_one();
}

EngineStats AsyncEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = stats_;
  }
  if (publisher_ != nullptr) {
    s.kv_events.enabled = true;
    s.kv_events.published = publisher_->num_events_published();
    s.kv_events.dropped = publisher_->num_events_dropped();
  }
  return s;
}

void AsyncEngine::reset_prefix_cache() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t ticket = ++resets_asked_;
  wake_.notify_one();
  if (!thread_.joinable()) return;  // not started: the loop does it when it starts
  reset_done_.wait(lock, [&] { return stopping_ || resets_done_ >= ticket; });
}

void AsyncEngine::set_kv_event_publisher(KvEventPublisher* publisher) {
  engine_->enable_kv_events();
  publisher_ = publisher;
}

void AsyncEngine::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  accepting_ = false;
  if (!thread_.joinable()) return;
  idle_.wait(lock, [&] { return stopping_ || (submissions_.empty() && !busy_); });
}

void AsyncEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = false;
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::loop() {
  for (;;) {
    std::deque<std::pair<GenerationRequest, OutputSink>> submissions;
    std::vector<std::string> aborts;
    bool stopping = false;
    uint64_t resets = 0;  // resets asked so far
    bool reset = false;   // some are not done yet
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !submissions_.empty() || !aborts_.empty() || busy_ || resets_asked_ > resets_done_;
      });
      resets = resets_asked_;
      reset = resets > resets_done_;
      submissions.swap(submissions_);
      aborts.swap(aborts_);
      stopping = stopping_;
      if (!submissions.empty()) busy_ = true;  // drain() must not see an idle gap here
    }
    for (auto& [request, sink] : submissions) engine_->add_request(std::move(request), std::move(sink));
    for (const std::string& id : aborts) engine_->abort(id);
    if (stopping) {
      engine_->abort_all();  // every client still waiting gets finish = abort
    } else {
      engine_->step();
    }
    if (reset) engine_->reset_prefix_cache();  // after the step: its blocks are cached first
    if (publisher_ != nullptr) publisher_->publish(engine_->take_kv_events());
    std::lock_guard<std::mutex> lock(mutex_);
    if (reset) {
      resets_done_ = resets;
      reset_done_.notify_all();
    }
    busy_ = engine_->has_work();
    stats_ = engine_->stats();
    if (stopping || (!busy_ && submissions_.empty())) idle_.notify_all();
    if (stopping) {
      reset_done_.notify_all();
      return;
    }
  }
}

}  // namespace fp8serve
