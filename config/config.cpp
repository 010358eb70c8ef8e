#include "config/config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string_view>
#include <utility>

namespace fp8serve {

namespace {

enum class Kind { flag, integer, real, text, choice };

// Which commands read a flag: giving one to a command that ignores it is an error, not a no-op.
enum CommandBits : unsigned { kInspect = 1, kGenerate = 2, kServe = 4, kEngine = kGenerate | kServe, kAll = 7 };

unsigned command_bit(Command c) {
  switch (c) {
    case Command::inspect: return kInspect;
    case Command::generate: return kGenerate;
    case Command::serve: return kServe;
  }
  return kAll;
}

const char* command_name(Command c) {
  switch (c) {
    case Command::inspect: return "inspect";
    case Command::generate: return "generate";
    case Command::serve: return "serve";
  }
  return "?";
}

// One flag: its name (without --), what it accepts, and how it lands in Config.
struct FlagSpec {
  std::string name;
  Kind kind;
  std::string help;
  double min = 0;
  double max = 0;
  std::vector<std::string> choices;
  std::function<void(Config&, const std::string&)> set;
  std::function<std::string(const Config&)> show;  // the default, for usage()
  unsigned commands = kEngine;                     // CommandBits
  bool list = false;  // comma-separated values; --config may give them as a JSON list
  bool object = false;  // a JSON object; --config may give it as one
};

[[noreturn]] void fail(const std::string& flag, const std::string& message) {
  throw ConfigError("--" + flag + ": " + message);
}

std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

std::string range_text(const FlagSpec& spec) {
  // Appended piece by piece: `"[" + std::string&&` trips GCC 12's false -Wrestrict (bug 105329).
  std::string out = "[";
  out += format_number(spec.min);
  out += ", ";
  out += format_number(spec.max);
  out += "]";
  return out;
}

int64_t parse_integer(const FlagSpec& spec, const std::string& text) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) fail(spec.name, "expected an integer in " + range_text(spec) + ", got '" + text + "'");
  if (static_cast<double>(value) < spec.min || static_cast<double>(value) > spec.max)
    fail(spec.name, "must be in " + range_text(spec) + ", got " + text);
  return value;
}

// A byte count: digits with an optional unit, 1000-based (k, M, G, T) or 1024-based (Ki, Mi,
// Gi, Ti), either one optionally followed by B: "1073741824", "1GiB", "512MB", "2G".
int64_t parse_bytes(const FlagSpec& spec, const std::string& text) {
  static const std::pair<std::string_view, int64_t> units[] = {
      {"", 1},       {"B", 1},        {"k", 1000},     {"K", 1000},      {"M", 1000'000},
      {"G", 1000'000'000}, {"T", 1000'000'000'000}, {"Ki", 1ll << 10}, {"Mi", 1ll << 20},
      {"Gi", 1ll << 30},   {"Ti", 1ll << 40}};
  const std::size_t digits = std::min(text.size(), text.find_first_not_of("0123456789"));
  std::string_view unit = std::string_view(text).substr(digits);
  if (unit.size() > 1 && unit.back() == 'B') unit.remove_suffix(1);  // "MB", "GiB"; "B" alone stays
  const auto found = std::find_if(std::begin(units), std::end(units), [unit](const auto& u) { return u.first == unit; });
  if (digits == 0 || digits > 16 || found == std::end(units)) {
    fail(spec.name, "expected a byte count such as 1073741824, 1GiB or 512MB in " + range_text(spec) +
                        ", got '" + text + "'");
  }
  int64_t number = 0;
  std::from_chars(text.data(), text.data() + digits, number);
  const double value = static_cast<double>(number) * static_cast<double>(found->second);
  if (value < spec.min || value > spec.max) fail(spec.name, "must be in " + range_text(spec) + ", got " + text);
  return number * found->second;
}

double parse_real(const FlagSpec& spec, const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value))
    fail(spec.name, "expected a number in " + range_text(spec) + ", got '" + text + "'");
  if (value < spec.min || value > spec.max) fail(spec.name, "must be in " + range_text(spec) + ", got " + text);
  return value;
}

bool parse_bool(const FlagSpec& spec, const std::string& text) {
  if (text == "true" || text == "1") return true;
  if (text == "false" || text == "0") return false;
  fail(spec.name, "expected true or false, got '" + text + "'");
}

FlagSpec integer_flag(std::string name, std::string help, double min, double max, int Config::*member) {
  FlagSpec spec{name, Kind::integer, std::move(help), min, max, {}, nullptr, nullptr};
  spec.set = [spec, member](Config& c, const std::string& v) { c.*member = static_cast<int>(parse_integer(spec, v)); };
  spec.show = [member](const Config& c) { return std::to_string(c.*member); };
  return spec;
}

FlagSpec bytes_flag(std::string name, std::string help, double min, double max, int64_t Config::*member) {
  FlagSpec spec{name, Kind::integer, std::move(help), min, max, {}, nullptr, nullptr};
  spec.set = [spec, member](Config& c, const std::string& v) { c.*member = parse_bytes(spec, v); };
  spec.show = [member](const Config& c) { return std::to_string(c.*member); };
  return spec;
}

FlagSpec real_flag(std::string name, std::string help, double min, double max, double Config::*member) {
  FlagSpec spec{name, Kind::real, std::move(help), min, max, {}, nullptr, nullptr};
  spec.set = [spec, member](Config& c, const std::string& v) { c.*member = parse_real(spec, v); };
  spec.show = [member](const Config& c) { return format_number(c.*member); };
  return spec;
}

FlagSpec text_flag(std::string name, std::string help, std::string Config::*member) {
  FlagSpec spec{name, Kind::text, std::move(help), 0, 0, {}, nullptr, nullptr};
  spec.set = [member](Config& c, const std::string& v) { c.*member = v; };
  spec.show = [member](const Config& c) { return c.*member; };
  return spec;
}

// A flag with a fixed set of values: choices[i].first is how the flag spells the value that
// choices[i].second stores (an enum: parsed once, here).
template <typename T>
FlagSpec choice_flag(std::string name, std::string help, std::vector<std::pair<std::string, T>> choices,
                     T Config::*member) {
  FlagSpec spec{name, Kind::choice, std::move(help), 0, 0, {}, nullptr, nullptr};
  for (const auto& choice : choices) spec.choices.push_back(choice.first);
  spec.set = [spec, choices, member](Config& c, const std::string& v) {
    for (const auto& [text, value] : choices)
      if (text == v) {
        c.*member = value;
        return;
      }
    std::string all;
    for (const auto& choice : spec.choices) all += (all.empty() ? "" : ", ") + choice;
    fail(spec.name, "must be one of " + all + ", got '" + v + "'");
  };
  spec.show = [choices, member](const Config& c) {
    for (const auto& [text, value] : choices)
      if (c.*member == value) return text;
    return std::string();
  };
  return spec;
}

// A choice kept as its text, for the code that reads it as text (make_device, spdlog's levels,
// parse_tool_call_format).
FlagSpec choice_flag(std::string name, std::string help, const std::vector<std::string>& choices,
                     std::string Config::*member) {
  std::vector<std::pair<std::string, std::string>> same;
  for (const auto& choice : choices) same.emplace_back(choice, choice);
  return choice_flag(std::move(name), std::move(help), std::move(same), member);
}

FlagSpec bool_flag(std::string name, std::string help, bool Config::*member, bool value_when_given) {
  FlagSpec spec{name, Kind::flag, std::move(help), 0, 0, {}, nullptr, nullptr};
  spec.set = [spec, member, value_when_given](Config& c, const std::string& v) {
    c.*member = v.empty() ? value_when_given : (parse_bool(spec, v) == value_when_given);
  };
  spec.show = [member](const Config& c) { return c.*member ? "on" : "off"; };
  return spec;
}

const std::vector<FlagSpec>& flag_specs() {
  static const std::vector<FlagSpec> specs = [] {
    std::vector<FlagSpec> s;
    s.push_back(choice_flag("device", "where to run", {"auto", "cpu", "cuda"}, &Config::device));
    std::vector<std::pair<std::string, KvDtype>> kv_dtypes;
    for (const KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) kv_dtypes.emplace_back(kv_dtype_name(dtype), dtype);
    s.push_back(choice_flag("kv-cache-dtype", "KV cache storage type", kv_dtypes, &Config::kv_cache_dtype));
    s.push_back(choice_flag("quantization",
                            "projection weights: none (as stored, bf16) or fp8 (E4M3, one scale per output channel); "
                            "FP8 checkpoints load as FP8 either way",
                            {{"none", Quantization::none}, {"fp8", Quantization::fp8}},
                            &Config::quantization));
    s.push_back(bool_flag("fp8-lm-head", "with --quantization fp8, the LM head too (faster, less accurate)",
                          &Config::fp8_lm_head, true));
    s.push_back(real_flag("kv-scale-margin", "FP8 scale headroom: scale = amax * margin / 448", 1.0, 64.0,
                          &Config::kv_scale_margin));
    s.push_back(integer_flag("kv-bf16-window", "FP8 KV: each sequence's newest tokens kept exact in bf16, quantized "
                             "as whole blocks leave (a multiple of --block-size; 0 = off)", 0, 4096, &Config::kv_bf16_window));
    s.push_back(choice_flag("kv-bf16-window-tensors", "what the bf16 window keeps exact (k: keys only, half the memory)",
                            {{"k", KvWindowTensors::k}, {"kv", KvWindowTensors::kv}}, &Config::kv_bf16_window_tensors));
    s.push_back(real_flag("kv-bf16-window-share", "the most of the KV budget the bf16 window's rings take: as many "
                          "rings as fit, one per running sequence: more rings, more sequences at once (docs/fp8-kv-cache.md)", 0.01, 0.9,
                          &Config::kv_bf16_window_share));
    s.push_back(choice_flag("kv-rotation", "FP8 KV: rotate each head's keys and values by a Walsh-Hadamard transform "
                            "before quantizing, which spreads outlier channels (none: store them as computed)",
                            {{"none", KvRotation::none}, {"hadamard", KvRotation::hadamard}}, &Config::kv_rotation));
    s.push_back(integer_flag("block-size", "tokens per KV block (8, 16 or 32)", 8, 32, &Config::block_size));
    s.push_back(bytes_flag("kv-cache-memory", "KV cache budget in bytes, e.g. 4GiB (0 = default)", 0, 1e15,
                           &Config::kv_cache_memory));
    s.push_back(real_flag("gpu-memory-utilization", "fraction of GPU memory to use", 0.05, 0.99,
                          &Config::gpu_memory_utilization));
    s.push_back(integer_flag("max-model-len", "longest sequence (0 = the model's)", 0, 1 << 24, &Config::max_model_len));
    s.push_back(integer_flag("max-num-seqs", "sequences per step", 1, 4096, &Config::max_num_seqs));
    s.push_back(integer_flag("max-num-batched-tokens", "tokens per step", 16, 1 << 20, &Config::max_num_batched_tokens));
    s.push_back(choice_flag("scheduling-policy", "which waiting request runs first: fcfs, or priority (the request's "
                            "\"priority\", lower first, then arrival; less urgent running requests are preempted for it)",
                            {{"fcfs", SchedulingPolicy::fcfs}, {"priority", SchedulingPolicy::priority}},
                            &Config::scheduling_policy));
    s.push_back(bool_flag("enable-prefix-caching", "reuse cached prefix blocks", &Config::enable_prefix_caching, true));
    s.push_back(bool_flag("no-enable-prefix-caching", "do not reuse prefix blocks", &Config::enable_prefix_caching, false));
    s.push_back(bool_flag("enforce-eager", "CUDA: run every step op by op, without CUDA graphs for decode",
                          &Config::enforce_eager, true));
    s.push_back(bool_flag("lazy-graph-capture",
                          "CUDA: capture each decode graph when its batch size is first met, not at start-up "
                          "(a faster start; a pause on first use)",
                          &Config::lazy_graph_capture, true));
    s.push_back(integer_flag("threads", "CPU threads (0 = all cores)", 0, 1024, &Config::threads));
    s.push_back(choice_flag("speculative-method", "speculative decoding: ngram (prompt lookup) or draft (--speculative-model)",
                            {{"none", SpeculativeMethod::none}, {"ngram", SpeculativeMethod::ngram},
                             {"draft", SpeculativeMethod::draft}},
                            &Config::speculative_method));
    s.push_back(integer_flag("num-speculative-tokens", "tokens proposed and verified per step", 1, 15,
                             &Config::num_speculative_tokens));
    s.push_back(integer_flag("prompt-lookup-min", "ngram: shortest suffix looked up", 1, 64, &Config::prompt_lookup_min));
    s.push_back(integer_flag("prompt-lookup-max", "ngram: longest suffix looked up", 1, 64, &Config::prompt_lookup_max));
    s.push_back(text_flag("speculative-model", "draft: the draft model (GGUF file or HF folder) with the same tokenizer", &Config::speculative_model));
    s.push_back(integer_flag("speculative-disable-by-batch-size",
                             "no speculation in a step with more decoding sequences than this (compute-bound)", 1, 4096,
                             &Config::speculative_disable_by_batch_size));
    s.push_back(text_flag("host", "listen address", &Config::host));
    s.push_back(integer_flag("port", "listen port", 1, 65535, &Config::port));
    s.push_back(text_flag("served-model-name", "model name in the API", &Config::served_model_name));
    s.push_back(text_flag("api-key", "bearer key required on every route but /health", &Config::api_key));
    s.push_back(text_flag("api-key-file", "file holding the API key (e.g. a mounted secret)", &Config::api_key_file));
    s.push_back(integer_flag("max-waiting-requests", "sequences that may wait for a slot; beyond it 503 (a request larger than max-num-seqs + this: 400)", 1, 1 << 20, &Config::max_waiting_requests));
    s.push_back(integer_flag("responses-store-max-entries", "stored /v1/responses (store: true) kept for GET and previous_response_id; the oldest go first (0: none kept)", 0, 1 << 24, &Config::responses_store_max_entries));
    s.push_back(bytes_flag("responses-store-max-bytes", "the stored responses' JSON, at most (e.g. 64MiB)", 0, 1e12, &Config::responses_store_max_bytes));
    s.push_back(real_flag("responses-store-ttl", "seconds a stored response is kept", 1, 1e9, &Config::responses_store_ttl));
    s.push_back(real_flag("shutdown-timeout", "seconds to drain on SIGTERM", 0, 3600, &Config::shutdown_timeout));
    s.push_back(text_flag("chat-template", "Jinja chat template file; replaces the model's own template, or gives one to a model without", &Config::chat_template_file));
    s.push_back(choice_flag("tool-call-parser", "how tool calls are written and read (auto: from the chat template)",
                            {"auto", "hermes", "llama3_json"}, &Config::tool_call_parser));
    s.push_back(bool_flag("metrics-public", "serve /metrics without the API key", &Config::metrics_public, true));
    FlagSpec ignored{"ignore-request-fields", Kind::text,
                     "comma-separated request fields a router adds (e.g. no_stop_trim) to accept and ignore rather "
                     "than answer 400; fields this server knows cannot be listed",
                     0, 0, {}, nullptr, nullptr};
    ignored.list = true;
    ignored.set = [](Config& c, const std::string& v) {
      c.ignore_request_fields.clear();
      std::string name;
      for (const char ch : v + ",") {
        if (ch != ',') {
          name += ch;
          continue;
        }
        if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != std::string::npos)
          fail("ignore-request-fields", "'" + name + "' is not a field name (a comma-separated list, e.g. no_stop_trim,rid)");
        c.ignore_request_fields.push_back(name);
        name.clear();
      }
    };
    ignored.show = [](const Config& c) {
      std::string out;
      for (const auto& n : c.ignore_request_fields) {
        if (!out.empty()) out += ',';
        out += n;
      }
      return out.empty() ? std::string("none") : out;
    };
    s.push_back(ignored);
    FlagSpec events{"kv-events-config", Kind::text,
                    "KV-cache events for prefix-aware routers, vLLM's JSON: {\"enable_kv_cache_events\": true, "
                    "\"endpoint\": \"tcp://*:5557\", \"topic\": \"...\", \"replay_endpoint\": \"...\"} (docs/routing.md)",
                    0, 0, {}, nullptr, nullptr};
    events.set = [](Config& c, const std::string& v) { c.kv_events = parse_kv_events_config(v); };
    events.show = [](const Config& c) { return c.kv_events.enable_kv_cache_events ? std::string("on") : std::string("off"); };
    events.object = true;
    s.push_back(events);
    s.push_back(bytes_flag("max-body-bytes", "request body limit (e.g. 8MiB); larger gets 413", 1024, 1 << 30, &Config::max_body_bytes));
    s.push_back(integer_flag("max-header-bytes", "request header limit; larger gets 431", 1024, 1 << 20,
                             &Config::max_header_bytes));
    s.push_back(real_flag("request-timeout", "seconds to receive one whole request", 0.1, 3600, &Config::request_timeout));
    s.push_back(choice_flag("log-level", "log verbosity", {"trace", "debug", "info", "warn", "error"}, &Config::log_level));
    s.push_back(text_flag("prompt", "the prompt", &Config::prompt));
    s.push_back(integer_flag("max-tokens", "tokens to generate", 1, 1 << 24, &Config::max_tokens));
    s.push_back(real_flag("temperature", "sampling temperature (0 = greedy)", 0, 100, &Config::temperature));
    s.push_back(real_flag("top-p", "nucleus mass", 1e-9, 1, &Config::top_p));
    s.push_back(integer_flag("top-k", "keep the k most likely (0 = all)", 0, 1 << 24, &Config::top_k));
    s.push_back(real_flag("min-p", "drop tokens below min_p * p_max", 0, 1, &Config::min_p));
    FlagSpec seed{"seed", Kind::integer, "sampling seed", 0, 1.8e19, {}, nullptr, nullptr};
    seed.set = [seed](Config& c, const std::string& v) {
      uint64_t value = 0;
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
      if (ec != std::errc() || ptr != v.data() + v.size()) fail(seed.name, "expected an unsigned integer, got '" + v + "'");
      c.seed = value;
    };
    seed.show = [](const Config& c) { return c.seed ? std::to_string(*c.seed) : std::string("random"); };
    s.push_back(seed);
    for (FlagSpec& spec : s) {
      static const char* const kServeOnly[] = {"host", "port", "served-model-name", "api-key", "api-key-file", "max-waiting-requests",
                                               "responses-store-max-entries", "responses-store-max-bytes", "responses-store-ttl",
                                               "shutdown-timeout", "chat-template", "metrics-public", "max-body-bytes",
                                               "max-header-bytes", "request-timeout", "ignore-request-fields",
                                               "kv-events-config"};
      static const char* const kGenerateOnly[] = {"prompt", "max-tokens", "temperature", "top-p", "top-k", "min-p", "seed"};
      auto in = [&](const auto& names) { return std::find(std::begin(names), std::end(names), spec.name) != std::end(names); };
      if (in(kServeOnly)) spec.commands = kServe;
      if (in(kGenerateOnly)) spec.commands = kGenerate;
      if (spec.name == "log-level") spec.commands = kAll;
    }
    return s;
  }();
  return specs;
}

const FlagSpec* find_flag(const std::string& name) {
  for (const auto& spec : flag_specs())
    if (spec.name == name) return &spec;
  return nullptr;
}

// --config FILE: a JSON object whose keys are long flag names; values are JSON scalars (a list
// for a list flag, an object for --kv-events-config). One file
// may configure several commands: a key another command reads is skipped, an unknown key is
// an error.
void apply_config_file(Config& config, const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("config", "cannot open '" + path + "'");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("config", "'" + path + "' is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) fail("config", "'" + path + "' must hold a JSON object of flag names to values");
  for (const auto& [key, value] : doc.items()) {
    const FlagSpec* spec = find_flag(key);
    if (spec == nullptr) fail("config", "unknown key '" + key + "' in '" + path + "'");
    if ((spec->commands & command_bit(config.command)) == 0) continue;
    std::string text;
    if (value.is_string()) text = value.get<std::string>();
    else if (value.is_boolean()) text = value.get<bool>() ? "true" : "false";
    else if (value.is_number_integer()) text = std::to_string(value.get<int64_t>());
    else if (value.is_number()) text = format_number(value.get<double>());
    else if (value.is_array() && spec->list) {  // its items, comma-separated
      for (const auto& item : value) {
        if (!item.is_string()) fail(key, "in '" + path + "' must be a list of strings");
        if (!text.empty()) text += ',';
        text += item.get<std::string>();
      }
    } else if (value.is_object() && spec->object) {
      text = value.dump();
    } else fail(key, "in '" + path + "' must be a string, number or boolean");
    spec->set(config, text);
  }
}

std::string environment_name(const std::string& flag) {
  std::string name = "FP8SERVE_";
  for (const char c : flag) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void apply_environment(Config& config, const Environment& env) {
  for (const auto& spec : flag_specs()) {
    // As in a --config file, a variable of another command's flag is skipped.
    if ((spec.commands & command_bit(config.command)) == 0) continue;
    const std::string name = environment_name(spec.name);
    const auto found = env.find(name);
    if (found == env.end() || found->second.empty()) continue;
    try {
      spec.set(config, found->second);
    } catch (const ConfigError& e) {
      throw ConfigError("environment " + name + ": " + e.what());
    }
    config.environment_variables.push_back(name);
  }
}

// The key is the file's content less trailing white space (an editor's final newline).
std::string read_api_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("api-key-file", "cannot open '" + path + "'");
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  // An empty key would turn authentication off without a word: refuse it.
  if (key.empty()) fail("api-key-file", "'" + path + "' is empty");
  return key;
}

Command parse_command(const std::string& word) {
  if (word == "inspect") return Command::inspect;
  if (word == "generate") return Command::generate;
  if (word == "serve") return Command::serve;
  throw ConfigError("unknown command '" + word + "': expected inspect, generate or serve");
}

}  // namespace

Environment flag_environment() {
  Environment env;
  for (const auto& spec : flag_specs()) {
    const std::string name = environment_name(spec.name);
    if (const char* value = std::getenv(name.c_str())) env[name] = value;
  }
  return env;
}

std::optional<std::string> help_requested(const std::vector<std::string>& args) {
  if (args.empty()) return std::nullopt;
  if (args[0] == "--help" || args[0] == "-h") return usage();
  const bool asks = args[0] == "help" || std::find_if(args.begin() + 1, args.end(), [](const std::string& a) {
                                           return a == "--help" || a == "-h";
                                         }) != args.end();
  if (!asks) return std::nullopt;
  const std::string& word = args[0] == "help" ? (args.size() > 1 ? args[1] : args[0]) : args[0];
  try {
    return usage(parse_command(word));
  } catch (const ConfigError&) {
    return usage();  // `fp8serve help`, or help for a command that does not exist: all of them
  }
}

Config parse_command_line(const std::vector<std::string>& args, const Environment& env) {
  if (args.empty()) throw ConfigError("missing command: expected inspect, generate or serve");
  Config config;
  config.command = parse_command(args[0]);

  // Pass 1 splits positionals from --flag[=value] pairs and finds --config, so that the file is
  // applied first and the command line overrides it whatever the order.
  std::vector<std::pair<const FlagSpec*, std::string>> given;
  std::string config_file;
  std::vector<std::string> positionals;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      positionals.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (name == "config") {
      if (!value) {
        if (i + 1 >= args.size()) fail(name, "needs a file name");
        value = args[++i];
      }
      config_file = *value;
      continue;
    }
    const FlagSpec* spec = find_flag(name);
    if (spec == nullptr) throw ConfigError("unknown flag --" + name + " (see fp8serve " + args[0] + " --help)");
    if ((spec->commands & command_bit(config.command)) == 0) {
      std::string users;
      for (const Command c : {Command::inspect, Command::generate, Command::serve})
        if (spec->commands & command_bit(c)) users += std::string(users.empty() ? "" : " and ") + command_name(c);
      fail(name, std::string(command_name(config.command)) + " does not use it (a flag of " + users + "; see fp8serve --help)");
    }
    if (!value) {
      if (spec->kind == Kind::flag) value = "";
      else if (i + 1 >= args.size()) fail(name, "needs a value");
      else value = args[++i];
    }
    given.emplace_back(spec, *value);
  }
  if (positionals.empty()) throw ConfigError("missing MODEL: a Hugging Face model folder or a .gguf file");
  if (positionals.size() > 1) throw ConfigError("unexpected argument '" + positionals[1] + "'");
  config.model = positionals[0];

  if (!config_file.empty()) apply_config_file(config, config_file);
  apply_environment(config, env);
  for (const auto& [spec, value] : given) spec->set(config, value);

  if (!config.api_key_file.empty()) {
    if (!config.api_key.empty()) fail("api-key-file", "give the key once: --api-key or --api-key-file, not both");
    config.api_key = read_api_key_file(config.api_key_file);
  }

  if (config.block_size != 8 && config.block_size != 16 && config.block_size != 32)
    fail("block-size", "must be 8, 16 or 32, got " + std::to_string(config.block_size));
  if (config.kv_bf16_window % config.block_size != 0)
    fail("kv-bf16-window", "must be a multiple of --block-size (" + std::to_string(config.block_size) + "), got " +
                               std::to_string(config.kv_bf16_window));
  if (config.prompt_lookup_min > config.prompt_lookup_max)
    fail("prompt-lookup-min", "must be <= --prompt-lookup-max (" + std::to_string(config.prompt_lookup_max) + ")");
  if (config.speculative_method == SpeculativeMethod::draft && config.speculative_model.empty())
    fail("speculative-method", "draft needs --speculative-model PATH (a model with the same tokenizer)");
  if (!config.speculative_model.empty() && config.speculative_method != SpeculativeMethod::draft)
    fail("speculative-model", "needs --speculative-method draft");
  if (config.kv_events.enable_kv_cache_events && !config.enable_prefix_caching)
    fail("kv-events-config", "KV-cache events describe the prefix cache: they need --enable-prefix-caching");
  if (config.command == Command::generate && config.prompt.empty())
    fail("prompt", "generate needs a non-empty --prompt");
  return config;
}

std::string usage(std::optional<Command> command) {
  static const char* const kLines[] = {"fp8serve inspect MODEL", "fp8serve generate MODEL --prompt TEXT [flags]",
                                       "fp8serve serve MODEL [flags]"};
  const unsigned only = command ? command_bit(*command) : kAll;
  std::ostringstream out;
  const char* prefix = "usage: ";
  for (const Command c : {Command::inspect, Command::generate, Command::serve}) {
    if ((command_bit(c) & only) == 0) continue;
    out << prefix << kLines[static_cast<int>(c)] << '\n';
    prefix = "       ";
  }
  if (!command) out << "       fp8serve COMMAND --help     that command's flags\n       fp8serve --version\n";
  out << "MODEL is a Hugging Face model folder or a .gguf file.\n"
         "Every flag can also be set in the environment as FP8SERVE_<FLAG> (FP8SERVE_HOST,\n"
         "FP8SERVE_API_KEY, FP8SERVE_KV_CACHE_DTYPE, ...): over --config, under the command line.\n\n"
         "flags (default):\n"
         "  --config FILE                 JSON object of flag names to values; the command line wins\n";
  const Config defaults;
  unsigned group = 0;
  for (const auto& spec : flag_specs()) {
    if ((spec.commands & only) == 0) continue;
    if (spec.commands != group) {
      group = spec.commands;
      out << (group == kEngine ? "\n serve and generate:\n" : group == kServe ? "\n serve:\n" : group == kGenerate ? "\n generate:\n" : "\n every command:\n");
    }
    std::string left = "  --" + spec.name;
    if (spec.kind != Kind::flag) left += spec.kind == Kind::choice ? " {...}" : " X";
    left.resize(std::max<size_t>(left.size() + 1, 32), ' ');
    out << left << spec.help;
    if (spec.kind == Kind::integer || spec.kind == Kind::real) out << ", " << range_text(spec);
    if (spec.kind == Kind::choice) {
      out << ":";
      for (const auto& c : spec.choices) out << ' ' << c;
    }
    const std::string shown = spec.show(defaults);
    if (!shown.empty()) out << " (" << shown << ")";
    out << '\n';
  }
  return out.str();
}

}  // namespace fp8serve
