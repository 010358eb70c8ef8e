#include "server/kv_events.hpp"

#include <spdlog/spdlog.h>
#include <zmq.h>

#include <chrono>
#include <cstring>
#include <stdexcept>

namespace fp8serve {

namespace {

// The few msgpack forms a batch needs (https://github.com/msgpack/msgpack/blob/master/spec.md),
// always in their shortest encoding, as msgpack libraries write them.
class Msgpack {
 public:
  void nil() { out_ += '\xc0'; }
  void array(std::size_t n) {
    if (n < 16) {
      byte(0x90 | n);
    } else if (n <= 0xffff) {
      byte(0xdc);
      be(n, 2);
    } else {
      byte(0xdd);
      be(n, 4);
    }
  }
  void uint(uint64_t v) {
    if (v < 128) {
      byte(v);
    } else if (v <= 0xff) {
      byte(0xcc);
      be(v, 1);
    } else if (v <= 0xffff) {
      byte(0xcd);
      be(v, 2);
    } else if (v <= 0xffffffffULL) {
      byte(0xce);
      be(v, 4);
    } else {
      byte(0xcf);
      be(v, 8);
    }
  }
  void real(double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    byte(0xcb);
    be(bits, 8);
  }
  void str(std::string_view s) {
    if (s.size() < 32) {
      byte(0xa0 | s.size());
    } else if (s.size() <= 0xff) {
      byte(0xd9);
      be(s.size(), 1);
    } else {
      byte(0xda);
      be(s.size(), 2);
    }
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  void byte(uint64_t b) { out_ += static_cast<char>(static_cast<uint8_t>(b)); }
  void be(uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) byte((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

std::string seq_bytes(int64_t seq) {
  std::string out(8, '\0');
  const auto u = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((u >> (8 * (7 - i))) & 0xff);
  return out;
}

std::string zmq_error() { return zmq_strerror(zmq_errno()); }

// Sends the frames as one message; false if the socket would block (a full ROUTER peer).
bool send_frames(void* socket, const std::vector<std::string_view>& frames) {
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) return false;
  }
  return true;
}

}  // namespace

std::string encode_kv_event_batch(double timestamp, const std::vector<KvCacheEvent>& events, int block_size) {
  Msgpack m;
  m.array(3);
  m.real(timestamp);
  m.array(events.size());
  for (const KvCacheEvent& e : events) {
    switch (e.type) {
      case KvCacheEvent::Type::block_stored:
        m.array(7);
        m.str("BlockStored");
        m.array(e.block_hashes.size());
        for (const uint64_t h : e.block_hashes) m.uint(h);
        if (e.parent_block_hash) m.uint(*e.parent_block_hash);
        else m.nil();
        m.array(e.token_ids.size());
        for (const int32_t t : e.token_ids) m.uint(static_cast<uint32_t>(t));
        m.uint(static_cast<uint64_t>(block_size));
        m.nil();  // lora_id
        m.str("GPU");
        break;
      case KvCacheEvent::Type::block_removed:
        m.array(3);
        m.str("BlockRemoved");
        m.array(e.block_hashes.size());
        for (const uint64_t h : e.block_hashes) m.uint(h);
        m.str("GPU");
        break;
      case KvCacheEvent::Type::all_blocks_cleared:
        m.array(1);
        m.str("AllBlocksCleared");
        break;
    }
  }
  m.uint(0);  // data_parallel_rank
  return m.take();
}

KvEventPublisher::KvEventPublisher(const KvEventsConfig& config, int block_size) : config_(config), block_size_(block_size) {
  if (config_.publisher == "zmq") {
    context_ = zmq_ctx_new();
    if (context_ == nullptr) throw std::runtime_error("--kv-events-config: cannot create a ZMQ context: " + zmq_error());
    auto open = [&](int type, const std::string& endpoint, const char* what) {
      void* socket = zmq_socket(context_, type);
      const int linger = 0;
      zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
      if (type == ZMQ_PUB) zmq_setsockopt(socket, ZMQ_SNDHWM, &config_.hwm, sizeof config_.hwm);
      if (zmq_bind(socket, endpoint.c_str()) != 0) {
        const std::string error = zmq_error();
        zmq_close(socket);
        close_sockets();
        throw std::runtime_error(std::string("--kv-events-config: cannot bind the ") + what + " '" + endpoint + "': " + error);
      }
      return socket;
    };
    pub_ = open(ZMQ_PUB, config_.endpoint, "event endpoint");
    if (!config_.replay_endpoint.empty()) replay_ = open(ZMQ_ROUTER, config_.replay_endpoint, "replay endpoint");
  }
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
  close_sockets();
}

void KvEventPublisher::close_sockets() {
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  pub_ = replay_ = nullptr;
  if (context_ != nullptr) zmq_ctx_term(context_);
  context_ = nullptr;
}

void KvEventPublisher::publish(std::vector<KvCacheEvent> events) {
  if (events.empty()) return;
  {
    std::lock_guard lock(mutex_);
    if (static_cast<int>(queue_.size()) < config_.max_queue_size) {
      queue_.push_back(std::move(events));
      wake_.notify_one();
      return;
    }
  }
  num_dropped_.fetch_add(events.size(), std::memory_order_relaxed);
}

void KvEventPublisher::run() {
  for (;;) {
    std::deque<std::vector<KvCacheEvent>> batches;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      auto ready = [&] { return stopping_ || !queue_.empty(); };
      // With a replay socket, wake now and then to answer its requests.
      if (replay_ != nullptr) wake_.wait_for(lock, std::chrono::milliseconds(20), ready);
      else wake_.wait(lock, ready);
      batches.swap(queue_);
      stopping = stopping_;
    }
    for (const auto& events : batches) {
      num_published_.fetch_add(events.size(), std::memory_order_relaxed);
      if (pub_ == nullptr && replay_ == nullptr) continue;  // publisher "null": nothing is encoded
      const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::string payload = encode_kv_event_batch(now, events, block_size_);
      const uint64_t seq = next_seq_++;
      if (pub_ != nullptr) {
        const std::string number = seq_bytes(static_cast<int64_t>(seq));
        if (!send_frames(pub_, {config_.topic, number, payload})) spdlog::warn("KV events: send failed: {}", zmq_error());
      }
      if (replay_ != nullptr) {
        replay_buffer_.emplace_back(seq, std::move(payload));
        while (static_cast<int>(replay_buffer_.size()) > config_.buffer_steps) replay_buffer_.pop_front();
      }
    }
    if (replay_ != nullptr) serve_replays();
    if (stopping) return;
  }
}

// Each waiting request: [identity, "", start] from a REQ socket, [identity, start] from a DEALER.
void KvEventPublisher::serve_replays() {
  for (;;) {
    std::vector<std::string> frames;
    int more = 1;
    while (more != 0) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, replay_, frames.empty() ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(&msg);
        if (frames.empty()) return;  // nothing waiting
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
    }
    const bool delimited = frames.size() == 3 && frames[1].empty();
    if (!(delimited || frames.size() == 2) || frames.back().size() != 8) {
      spdlog::warn("KV events: ignored a malformed replay request ({} frames)", frames.size());
      continue;
    }
    uint64_t start = 0;
    for (const char c : frames.back()) start = (start << 8) | static_cast<uint8_t>(c);
    auto reply = [&](std::string_view number, std::string_view payload) {
      if (delimited) return send_frames(replay_, {frames[0], "", number, payload});
      return send_frames(replay_, {frames[0], number, payload});
    };
    bool sent = true;
    for (const auto& [seq, payload] : replay_buffer_) {
      if (seq >= start && sent) sent = reply(seq_bytes(static_cast<int64_t>(seq)), payload);
    }
    if (sent) reply(seq_bytes(-1), "");
  }
}

}  // namespace fp8serve
