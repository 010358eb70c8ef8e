#pragma once
// The engine on its own thread (docs/design.md, "One request"): HTTP threads submit and abort through a
// mutex-guarded queue; the engine thread drains the queue between steps, so the Engine itself
// needs no lock. Outputs reach each request's OutputSink on the engine thread.
//
//   start()           launches the thread
//   submit / abort    from any thread (EngineClient, server/api/engine_client.hpp)
//   stats()           the snapshot taken after the last step (never waits for a step)
//   drain()           stop accepting (new submissions finish with an error), wait until every
//                     running and queued request has finished (SIGTERM)
//   stop()            abort what is left and join the thread; the destructor calls it
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/api/engine_client.hpp"
#include "server/engine/engine.hpp"
#include "server/kv_events.hpp"

namespace fp8serve {

class AsyncEngine final : public EngineClient {
 public:
  explicit AsyncEngine(std::unique_ptr<Engine> engine);
  ~AsyncEngine() override;
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  void start();
  void submit(GenerationRequest request, OutputSink sink) override;
  void abort(const std::string& request_id) override;
  EngineStats stats() const override;
  void reset_prefix_cache() override;
  // Before start(): the engine's KV-cache events go to `publisher` after each step (it must
  // outlive this object's thread).
  void set_kv_event_publisher(KvEventPublisher* publisher);
  void drain();
  void stop();

  // Read-only facts fixed at construction (safe from any thread).
  const Engine& engine() const { return *engine_; }

 private:
  void loop();

  std::unique_ptr<Engine> engine_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;     // new work or stop
  std::condition_variable idle_;     // the engine ran out of work (drain waits on it)
  std::deque<std::pair<GenerationRequest, OutputSink>> submissions_;
  std::vector<std::string> aborts_;
  bool accepting_ = true;
  bool stopping_ = false;
  bool busy_ = false;  // the engine holds unfinished requests
  uint64_t resets_asked_ = 0;  // reset_prefix_cache() calls, and how many the loop has done
  uint64_t resets_done_ = 0;
  std::condition_variable reset_done_;
  KvEventPublisher* publisher_ = nullptr;
  EngineStats stats_;
};

}  // namespace fp8serve
