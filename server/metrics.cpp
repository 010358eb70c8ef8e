#include "server/metrics.hpp"

#include <cmath>
#include <charconv>

namespace fp8serve {

namespace {

// Prometheus' canonical float text: integers without exponent noise, +Inf/-Inf/NaN spelled out.
std::string number_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  return std::string(buf, result.ptr);
}

// Appends only (no operator+ chains): GCC 12 warns falsely (-Wrestrict) on `" " + string`.
void family(std::string& out, const std::string& name, const char* type, const char* help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.append(" ").append(number_text(value)).append("\n");
}

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0};
}

std::vector<double> token_buckets() { return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000}; }

// Scales are amax * margin / 448: powers of four from 1e-6 to ~1 cover fp32 activations.
std::vector<double> scale_buckets() {
  std::vector<double> b;
  for (double x = 1.0 / (1 << 20); x <= 4.0; x *= 4) b.push_back(x);
  return b;
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : labels + ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", sep + "le=\"" + number_text(bounds_[i]) + "\"", static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", sep + "le=\"+Inf\"", static_cast<double>(count_));
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, static_cast<double>(count_));
}

ServerMetrics::ServerMetrics()
    : ttft_(latency_buckets()),
      inter_token_(latency_buckets()),
      e2e_(latency_buckets()),
      queue_(latency_buckets()),
      prompt_len_(token_buckets()),
      generation_len_(token_buckets()) {
  for (const char* reason : {"stop", "length", "abort", "error"}) success_by_reason_[reason] = 0;
}

void ServerMetrics::record_request(const RequestRecord& r) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(std::max(0, r.prompt_tokens));
  generation_tokens_ += static_cast<uint64_t>(std::max(0, r.completion_tokens));
  ++success_by_reason_[r.finish_reason];
  if (r.ttft_s >= 0) ttft_.observe(r.ttft_s);
  if (r.queue_s >= 0) queue_.observe(r.queue_s);
  e2e_.observe(r.e2e_s);
  prompt_len_.observe(r.prompt_tokens);
  generation_len_.observe(r.completion_tokens);
}

void ServerMetrics::record_inter_token(double seconds) {
  std::lock_guard lock(mutex_);
  inter_token_.observe(seconds);
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard lock(mutex_);
  ++http_by_status_[status];
}

std::string ServerMetrics::render(const EngineStats& engine) const {
  std::string out;
  out.reserve(16384);
  auto gauge = [&](const char* name, const char* help, double value) {
    family(out, name, "gauge", help);
    sample(out, name, "", value);
  };
  auto counter = [&](const char* name, const char* help, double value) {
    family(out, name, "counter", help);
    sample(out, name, "", value);
  };
  // A counter with one sample per index: label="0", "1", ...
  auto indexed_counter = [&](const char* name, const char* help, const char* label, const auto& values) {
    family(out, name, "counter", help);
    for (size_t i = 0; i < values.size(); ++i) {
      std::string labels(label);
      labels.append("=\"").append(std::to_string(i)).append("\"");
      sample(out, name, labels, static_cast<double>(values[i]));
    }
  };
  {
    const EngineStats::CacheConfig& c = engine.cache;
    const char* name = "fp8serve:cache_config_info";
    family(out, name, "gauge", "The KV cache's configuration, in labels (vLLM's cache_config_info); the value is 1.");
    std::string labels = "block_size=\"" + std::to_string(c.block_size) + "\"";
    labels.append(",cache_dtype=\"").append(escape_label_value(c.cache_dtype)).append("\"");
    labels.append(",enable_prefix_caching=\"").append(c.prefix_caching ? "True" : "False").append("\"");
    labels.append(",kv_bf16_window=\"").append(std::to_string(c.bf16_window)).append("\"");
    labels.append(",kv_rotation=\"").append(escape_label_value(c.rotation)).append("\"");
    labels.append(",num_gpu_blocks=\"").append(std::to_string(c.num_blocks)).append("\"");
    sample(out, name, labels, 1.0);
  }
  gauge("fp8serve:num_requests_running", "Sequences in the running batch.", engine.num_running);
  gauge("fp8serve:num_requests_waiting", "Sequences waiting to be scheduled.", engine.num_waiting);
  gauge("fp8serve:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", engine.kv_usage);
  gauge("fp8serve:kv_bf16_tail_usage_perc",
        "Fraction of the bf16 window's tail rings owned by running sequences (1 = --max-num-seqs; 0 without a window).",
        engine.kv_tail_usage);
  gauge("fp8serve:kv_bf16_tail_tokens", "Tokens held exact in the bf16 window's tail rings now.",
        static_cast<double>(engine.kv_tail_tokens));
  counter("fp8serve:kv_bf16_window_ring_waits_total",
          "Steps in which the next waiting sequence had its KV blocks but no free bf16 window ring: every running "
          "sequence holds one, so the rings (a capped share of the KV budget) cap the concurrency.",
          static_cast<double>(engine.kv_ring_waits));
  counter("fp8serve:num_preemptions_total", "Sequences preempted (blocks freed, recomputed later).",
          static_cast<double>(engine.num_preemptions));
  if (!engine.by_priority.empty()) {  // --scheduling-policy priority: the same per request priority
    auto per_priority = [&](const char* name, const char* type, const char* help, auto value) {
      family(out, name, type, help);
      for (const EngineStats::PriorityClass& c : engine.by_priority)
        sample(out, name, "priority=\"" + std::to_string(c.priority) + "\"", static_cast<double>(value(c)));
    };
    per_priority("fp8serve:num_requests_running_by_priority", "gauge", "Sequences in the running batch, by priority.",
                 [](const EngineStats::PriorityClass& c) { return c.num_running; });
    per_priority("fp8serve:num_requests_waiting_by_priority", "gauge", "Sequences waiting to be scheduled, by priority.",
                 [](const EngineStats::PriorityClass& c) { return c.num_waiting; });
    per_priority("fp8serve:num_preemptions_by_priority_total", "counter", "Sequences preempted, by their priority.",
                 [](const EngineStats::PriorityClass& c) { return c.num_preemptions; });
  }
  if (engine.speculative) {
    counter("fp8serve:spec_decode_num_drafts_total", "Speculative decoding: drafts verified (one per sequence and step).",
            static_cast<double>(engine.spec_num_drafts));
    counter("fp8serve:spec_decode_num_draft_tokens_total", "Speculative decoding: tokens proposed.",
            static_cast<double>(engine.spec_num_draft_tokens));
    counter("fp8serve:spec_decode_num_accepted_tokens_total", "Speculative decoding: proposed tokens accepted.",
            static_cast<double>(engine.spec_num_accepted_tokens));
    indexed_counter("fp8serve:spec_decode_num_accepted_tokens_per_pos_total",
                    "Speculative decoding: accepted tokens by position in the draft.", "position",
                    engine.spec_accepted_per_pos);
    if (engine.spec_draft_kv_usage >= 0)
      gauge("fp8serve:spec_decode_draft_kv_cache_usage_perc", "Fraction of the draft model's KV cache blocks in use.",
            engine.spec_draft_kv_usage);
  }
  counter("fp8serve:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(engine.prefix_queries));
  counter("fp8serve:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(engine.prefix_hits));

  if (engine.kv_events.enabled) {
    counter("fp8serve:kv_events_published_total", "KV-cache events published for routers (--kv-events-config).",
            static_cast<double>(engine.kv_events.published));
    counter("fp8serve:kv_events_dropped_total",
            "KV-cache events dropped because the publisher's queue was full (a router's index then misses them).",
            static_cast<double>(engine.kv_events.dropped));
  }

  indexed_counter("fp8serve:kv_fp8_saturated_elements_total",
                  "KV elements clipped to +-448 by a frozen FP8 scale, per layer.", "layer", engine.saturated_per_layer);
  {
    Histogram k(scale_buckets()), v(scale_buckets());
    for (float s : engine.k_scales) k.observe(s);
    for (float s : engine.v_scales) v.observe(s);
    family(out, "fp8serve:kv_scale", "histogram", "Calibrated per-tensor FP8 scales of the running sequences, all layers.");
    k.write(out, "fp8serve:kv_scale", "tensor=\"k\"");
    v.write(out, "fp8serve:kv_scale", "tensor=\"v\"");
  }

  std::lock_guard lock(mutex_);
  counter("fp8serve:prompt_tokens_total", "Prompt tokens of finished requests.", static_cast<double>(prompt_tokens_));
  counter("fp8serve:generation_tokens_total", "Generated tokens of finished requests.", static_cast<double>(generation_tokens_));
  family(out, "fp8serve:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, n] : success_by_reason_)
    sample(out, "fp8serve:request_success_total", "finished_reason=\"" + escape_label_value(reason) + "\"",
           static_cast<double>(n));
  family(out, "fp8serve:http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [status, n] : http_by_status_)
    sample(out, "fp8serve:http_responses_total", "status=\"" + std::to_string(status) + "\"", static_cast<double>(n));

  auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    family(out, name, "histogram", help);
    h.write(out, name, "");
  };
  histogram("fp8serve:time_to_first_token_seconds", "Time from arrival to the first generated token.", ttft_);
  histogram("fp8serve:inter_token_latency_seconds", "Time between consecutive outputs of a request.", inter_token_);
  histogram("fp8serve:e2e_request_latency_seconds", "Time from arrival to the last token.", e2e_);
  histogram("fp8serve:request_queue_time_seconds", "Time from arrival to the start of the request's first engine step.", queue_);
  histogram("fp8serve:request_prompt_tokens", "Prompt length of finished requests.", prompt_len_);
  histogram("fp8serve:request_generation_tokens", "Generated tokens of finished requests.", generation_len_);
  return out;
}

}  // namespace fp8serve
