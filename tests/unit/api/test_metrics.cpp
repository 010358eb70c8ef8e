// The /metrics text: every sample line parses as exposition format 0.0.4, every family has
// HELP and TYPE before its samples, histograms are cumulative and end with +Inf == _count.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <regex>
#include <sstream>

#include "server/metrics.hpp"

using namespace fp8serve;

namespace {

std::map<std::string, double> samples_of(const std::string& text) {
  static const std::regex line_re(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$)");
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      CHECK((type == "counter" || type == "gauge" || type == "histogram"));
      CHECK(types.count(name) == 0);  // one TYPE per family
      types[name] = type;
      continue;
    }
    std::smatch m;
    INFO(line);
    REQUIRE(std::regex_match(line, m, line_re));
    std::string family = m[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!types.count(family) && family.size() > std::strlen(suffix) &&
          family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        family.resize(family.size() - std::strlen(suffix));
    CHECK(types.count(family) == 1);  // TYPE came first
    out[std::string(m[1]) + std::string(m[2])] = std::stod(m[3]);
  }
  return out;
}

}  // namespace

TEST_CASE("histogram buckets are cumulative") {
  Histogram h({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 3.0}) h.observe(v);
  std::string text;
  h.write(text, "x", "");
  CHECK(text ==
        "x_bucket{le=\"0.1\"} 2\nx_bucket{le=\"1\"} 3\nx_bucket{le=\"+Inf\"} 5\nx_sum 5.65\n"
        "x_count 5\n");
}

TEST_CASE("ServerMetrics renders vLLM-named families with engine gauges") {
  ServerMetrics m;
  m.record_request({"stop", 10, 5, -1, 0.2, 1.0});
  m.record_request({"length", 4, 16, -1, 0.03, 2.0});
  m.record_inter_token(0.05);
  m.record_http_status(200);
  m.record_http_status(400);
  EngineStats e;
  e.num_running = 3;
  e.num_waiting = 1;
  e.kv_usage = 0.25;
  e.kv_tail_usage = 0.375;
  e.kv_tail_tokens = 96;
  e.num_preemptions = 7;
  e.prefix_queries = 100;
  e.prefix_hits = 40;
  e.saturated_per_layer = {0, 12};
  e.k_scales = {0.01f, 0.02f};
  e.v_scales = {0.5f};
  e.cache = {16, 5825, "fp8_e4m3", true, 64, "hadamard"};
  const auto s = samples_of(m.render(e));
  CHECK(s.at("fp8serve:cache_config_info{block_size=\"16\",cache_dtype=\"fp8_e4m3\",enable_prefix_caching=\"True\","
             "kv_bf16_window=\"64\",kv_rotation=\"hadamard\",num_gpu_blocks=\"5825\"}") == 1);
  CHECK(s.at("fp8serve:num_requests_running") == 3);
  CHECK(s.at("fp8serve:num_requests_waiting") == 1);
  CHECK(s.at("fp8serve:kv_cache_usage_perc") == 0.25);
  CHECK(s.at("fp8serve:kv_bf16_tail_usage_perc") == 0.375);
  CHECK(s.at("fp8serve:kv_bf16_tail_tokens") == 96);
  CHECK(s.at("fp8serve:num_preemptions_total") == 7);
  CHECK(s.at("fp8serve:prefix_cache_hits_total") == 40);
  CHECK(s.count("fp8serve:kv_events_published_total") == 0);  // only with --kv-events-config
  e.kv_events = {true, 120, 3};
  const auto with_events = samples_of(m.render(e));
  CHECK(with_events.at("fp8serve:kv_events_published_total") == 120);
  CHECK(with_events.at("fp8serve:kv_events_dropped_total") == 3);
  CHECK(s.at("fp8serve:prompt_tokens_total") == 14);
  CHECK(s.at("fp8serve:generation_tokens_total") == 21);
  CHECK(s.at("fp8serve:request_success_total{finished_reason=\"stop\"}") == 1);
  CHECK(s.at("fp8serve:request_success_total{finished_reason=\"length\"}") == 1);
  CHECK(s.at("fp8serve:request_success_total{finished_reason=\"abort\"}") == 0);
  CHECK(s.at("fp8serve:kv_fp8_saturated_elements_total{layer=\"1\"}") == 12);
  CHECK(s.at("fp8serve:kv_scale_count{tensor=\"k\"}") == 2);
  CHECK(s.at("fp8serve:kv_scale_count{tensor=\"v\"}") == 1);
  CHECK(s.at("fp8serve:time_to_first_token_seconds_count") == 2);
  CHECK(s.at("fp8serve:time_to_first_token_seconds_bucket{le=\"0.04\"}") == 1);
  CHECK(s.at("fp8serve:time_to_first_token_seconds_bucket{le=\"+Inf\"}") == 2);
  CHECK(s.at("fp8serve:e2e_request_latency_seconds_sum") == 3.0);
  CHECK(s.at("fp8serve:inter_token_latency_seconds_count") == 1);
  CHECK(s.at("fp8serve:http_responses_total{status=\"400\"}") == 1);
  CHECK(escape_label_value("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
}
