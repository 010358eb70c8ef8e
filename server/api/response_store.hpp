#pragma once
// The Responses API's stored responses (`store: true`, OpenAI's default): what
// GET /v1/responses/{id} returns and what `previous_response_id` continues. In memory, bounded
// three ways (--responses-store-max-entries, --responses-store-max-bytes, --responses-store-ttl):
// the oldest entries go first. Nothing survives a restart, and replicas do not share it, so a
// router must send a continued conversation to the replica that stored it (or the client resends
// the history as items). Thread-safe: sessions on every I/O thread read and write it.
#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace fp8serve {

struct StoredResponse {
  nlohmann::ordered_json response;      // the response object, as it was returned
  nlohmann::ordered_json input_items;   // this request's input items, each with its id
  nlohmann::ordered_json conversation;  // every item up to and including the output: what a continuation renders
};

struct ResponseStoreLimits {
  size_t max_entries = 1000;            // 0: nothing is stored
  size_t max_bytes = 64u << 20;         // of the entries' JSON text
  double ttl_s = 24 * 3600.0;           // an entry older than this is gone
};

class ResponseStore {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  explicit ResponseStore(ResponseStoreLimits limits = {}, Clock clock = std::chrono::steady_clock::now);

  // Stores (or replaces) `id`, then drops the oldest entries until the store is within its caps.
  // Returns false when the entry alone exceeds them (it is not stored).
  bool put(const std::string& id, StoredResponse entry);
  // Null when `id` was never stored, was deleted, evicted or has expired.
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);

  size_t size() const;
  size_t bytes() const;
  const ResponseStoreLimits& limits() const { return limits_; }

 private:
  struct Entry {
    std::string id;
    std::shared_ptr<const StoredResponse> value;
    size_t bytes = 0;
    std::chrono::steady_clock::time_point expires;
  };
  void drop_expired(std::chrono::steady_clock::time_point now);  // holds mutex_
  void drop(std::list<Entry>::iterator it);                       // holds mutex_

  ResponseStoreLimits limits_;
  Clock clock_;
  mutable std::mutex mutex_;
  std::list<Entry> order_;  // oldest first (insertion order = expiry order: one TTL)
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace fp8serve
