#pragma once
// --kv-events-config: KV-cache events for prefix-aware routers, as vLLM's KVEventsConfig (the
// same JSON keys and defaults; server/kv_events.hpp, docs/routing.md).
#include <string>

namespace fp8serve {

struct KvEventsConfig {
  bool enable_kv_cache_events = false;
  std::string publisher = "zmq";             // zmq | null (events recorded, published nowhere)
  std::string endpoint = "tcp://*:5557";     // the PUB socket, bound here; subscribers connect
  std::string replay_endpoint;               // a ROUTER socket for replays from a sequence number ("": none)
  int buffer_steps = 10000;                  // batches kept for replay
  int hwm = 100000;                          // ZMQ send high-water mark (messages per subscriber)
  int max_queue_size = 100000;               // batches waiting for the publisher thread; beyond it dropped
  std::string topic;                         // the first frame of every message
};

// The flag's JSON, each key checked: an unknown key or a value of the wrong type throws
// ConfigError naming the flag (a typo would otherwise leave events silently off).
KvEventsConfig parse_kv_events_config(const std::string& text);

}  // namespace fp8serve
