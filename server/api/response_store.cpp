#include "server/api/response_store.hpp"

namespace fp8serve {

ResponseStore::ResponseStore(ResponseStoreLimits limits, Clock clock) : limits_(limits), clock_(std::move(clock)) {}

void ResponseStore::drop(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->id);
  order_.erase(it);
}

void ResponseStore::drop_expired(std::chrono::steady_clock::time_point now) {
  while (!order_.empty() && order_.front().expires <= now) drop(order_.begin());
}

bool ResponseStore::put(const std::string& id, StoredResponse entry) {
  const size_t bytes = id.size() + entry.response.dump().size() + entry.input_items.dump().size() +
                       entry.conversation.dump().size();
  const auto now = clock_();
  std::lock_guard lock(mutex_);
  if (const auto it = index_.find(id); it != index_.end()) drop(it->second);
  drop_expired(now);
  if (limits_.max_entries == 0 || bytes > limits_.max_bytes) return false;
  const auto ttl = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(limits_.ttl_s));
  order_.push_back(Entry{id, std::make_shared<const StoredResponse>(std::move(entry)), bytes, now + ttl});
  index_[id] = std::prev(order_.end());
  bytes_ += bytes;
  while (order_.size() > limits_.max_entries || bytes_ > limits_.max_bytes) drop(order_.begin());
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  const auto now = clock_();
  std::lock_guard lock(mutex_);
  drop_expired(now);
  const auto it = index_.find(id);
  return it == index_.end() ? nullptr : it->second->value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = index_.find(id);
  if (it == index_.end()) return false;
  drop(it->second);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mutex_);
  return order_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace fp8serve
