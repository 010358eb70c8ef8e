#pragma once
// The KV-cache event publisher (--kv-events-config): the prefix cache's events
// (cache/kv_events.hpp) on a ZMQ PUB socket in vLLM's wire format, which Dynamo's KV indexer and
// llm-d's scheduler read (docs/routing.md).
//
// Each message is three frames: the topic, an 8-byte big-endian sequence number (0, 1, 2, ...:
// one per engine step that changed the cache), and msgpack [timestamp, [event...], 0] with each
// event a positional array:
//   ["BlockStored", [hash...], parent_hash | nil, [token_id...], block_size, nil, "GPU"]
//   ["BlockRemoved", [hash...], "GPU"]
//   ["AllBlocksCleared"]
// The trailing 0 is the data-parallel rank; nil is the LoRA id; "GPU" is vLLM's name for the
// engine's own KV pool (the tier routers score), whichever device holds it.
//
// With a replay endpoint, a ROUTER socket answers a request [start_seq as 8 bytes big-endian]
// with every buffered message from that number on, each [seq, payload], then [-1, empty].
//
// publish() runs on the engine thread and only moves the events into a bounded queue; a thread
// of its own encodes and sends them. A full queue drops the batch (counted); a slow subscriber
// loses messages at the socket's high-water mark (ZMQ's PUB never blocks). Nothing waits on
// the network.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cache/kv_events.hpp"
#include "config/config.hpp"

namespace fp8serve {

// One batch as msgpack [timestamp, [event...], data_parallel_rank] (above), for the tests too.
std::string encode_kv_event_batch(double timestamp, const std::vector<KvCacheEvent>& events, int block_size);

class KvEventPublisher {
 public:
  // Binds the sockets now: an endpoint that cannot bind throws std::runtime_error naming it.
  KvEventPublisher(const KvEventsConfig& config, int block_size);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // One step's events, oldest first (an empty batch is not sent). Never blocks on the network.
  void publish(std::vector<KvCacheEvent> events);

  uint64_t num_events_published() const { return num_published_.load(std::memory_order_relaxed); }
  uint64_t num_events_dropped() const { return num_dropped_.load(std::memory_order_relaxed); }

 private:
  void run();
  void serve_replays();
  void close_sockets();

  KvEventsConfig config_;
  int block_size_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::vector<KvCacheEvent>> queue_;
  bool stopping_ = false;

  // The publisher thread's own.
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> replay_buffer_;

  std::atomic<uint64_t> num_published_{0};
  std::atomic<uint64_t> num_dropped_{0};
  std::thread thread_;
};

}  // namespace fp8serve
