#pragma once
// Prometheus metrics (text exposition format 0.0.4) under vLLM's names with an `fp8serve:`
// prefix, so existing vLLM dashboards adapt by changing the prefix. The front end records
// request-level figures here (thread-safe); engine gauges arrive as an EngineStats snapshot
// when /metrics is scraped, so the engine thread never waits on a scrape.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "server/api/engine_client.hpp"

namespace fp8serve {

// A cumulative histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // "# HELP", "# TYPE" and the _bucket/_sum/_count samples; `labels` is `key="value"` or empty.
  void write(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // One finished request (all its choices). finish_reason: "stop", "length", "abort", "error".
  struct RequestRecord {
    std::string finish_reason;
    int prompt_tokens = 0;
    int completion_tokens = 0;
    double queue_s = -1;   // < 0: unknown
    double ttft_s = -1;    // < 0: no token was produced
    double e2e_s = 0;
  };
  void record_request(const RequestRecord& record);
  void record_inter_token(double seconds);
  void record_http_status(int status);

  // The whole /metrics body, engine gauges included.
  std::string render(const EngineStats& engine) const;

 private:
  mutable std::mutex mutex_;
  uint64_t prompt_tokens_ = 0;
  uint64_t generation_tokens_ = 0;
  std::map<std::string, uint64_t> success_by_reason_;
  std::map<int, uint64_t> http_by_status_;
  Histogram ttft_;
  Histogram inter_token_;
  Histogram e2e_;
  Histogram queue_;
  Histogram prompt_len_;
  Histogram generation_len_;
};

// Escapes a label value for the text format (backslash, quote, newline).
std::string escape_label_value(const std::string& value);

}  // namespace fp8serve
