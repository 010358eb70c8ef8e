#include "config/kv_events_config.hpp"

#include <nlohmann/json.hpp>

#include "config/config.hpp"

namespace fp8serve {

namespace {

[[noreturn]] void fail(const std::string& message) { throw ConfigError("--kv-events-config: " + message); }

}  // namespace

KvEventsConfig parse_kv_events_config(const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail("expected a JSON object such as {\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\"}, got '" + text + "'");
  }
  if (!doc.is_object()) fail("expected a JSON object, got '" + text + "'");
  KvEventsConfig c;
  auto text_of = [&](const std::string& key, const nlohmann::json& v) {
    if (!v.is_string()) fail("'" + key + "' must be a string");
    return v.get<std::string>();
  };
  auto count_of = [&](const std::string& key, const nlohmann::json& v, int min) {
    if (!v.is_number_integer() || v.get<int64_t>() < min || v.get<int64_t>() > (1 << 30))
      fail("'" + key + "' must be an integer in [" + std::to_string(min) + ", 1073741824]");
    return static_cast<int>(v.get<int64_t>());
  };
  for (const auto& [key, v] : doc.items()) {
    if (key == "enable_kv_cache_events") {
      if (!v.is_boolean()) fail("'enable_kv_cache_events' must be true or false");
      c.enable_kv_cache_events = v.get<bool>();
    } else if (key == "publisher") {
      c.publisher = text_of(key, v);
      if (c.publisher != "zmq" && c.publisher != "null") fail("'publisher' must be \"zmq\" or \"null\", got '" + c.publisher + "'");
    } else if (key == "endpoint") {
      c.endpoint = text_of(key, v);
    } else if (key == "replay_endpoint") {
      c.replay_endpoint = v.is_null() ? std::string() : text_of(key, v);
    } else if (key == "topic") {
      c.topic = text_of(key, v);
    } else if (key == "buffer_steps") {
      c.buffer_steps = count_of(key, v, 1);
    } else if (key == "hwm") {
      c.hwm = count_of(key, v, 0);
    } else if (key == "max_queue_size") {
      c.max_queue_size = count_of(key, v, 1);
    } else {
      fail("unknown key '" + key + "' (enable_kv_cache_events, publisher, endpoint, replay_endpoint, topic, "
                 "buffer_steps, hwm, max_queue_size)");
    }
  }
  if (c.enable_kv_cache_events && c.publisher == "zmq" && c.endpoint.empty()) fail("'endpoint' must not be empty");
  return c;
}

}  // namespace fp8serve
