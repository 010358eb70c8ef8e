#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/config.hpp"

using fp8serve::Command;
using fp8serve::ConfigError;
using fp8serve::KvDtype;
using fp8serve::KvRotation;
using fp8serve::KvWindowTensors;
using fp8serve::parse_command_line;
using fp8serve::Quantization;
using fp8serve::SpeculativeMethod;

namespace {

// The ConfigError message for a command line, or "no error".
std::string message_of(const std::vector<std::string>& args) {
  try {
    parse_command_line(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("defaults and flags of every kind parse", "[config]") {
  const auto c = parse_command_line({"serve", "model.gguf", "--port", "9000", "--kv-cache-dtype=bf16",
                                     "--kv-scale-margin", "2.5", "--no-enable-prefix-caching"});
  CHECK(c.command == Command::serve);
  CHECK(c.model == "model.gguf");
  CHECK(c.port == 9000);
  CHECK(c.kv_cache_dtype == KvDtype::bf16);
  CHECK(c.kv_scale_margin == 2.5);
  CHECK_FALSE(c.enable_prefix_caching);
  CHECK(parse_command_line({"generate", "m", "--prompt", "p", "--seed", "18446744073709551615"}).seed == 18446744073709551615ull);
  CHECK(c.host == "127.0.0.1");  // loopback unless told otherwise
  CHECK(c.block_size == 16);
  CHECK(c.quantization == Quantization::none);  // weights as stored unless told otherwise
  CHECK_FALSE(c.fp8_lm_head);
  const auto q = parse_command_line({"serve", "m", "--quantization", "fp8", "--fp8-lm-head"});
  CHECK(q.quantization == Quantization::fp8);
  CHECK(q.fp8_lm_head);
  CHECK(c.kv_bf16_window == 96);  // docs/fp8-kv-cache.md's choice: 96 tokens, K only
  CHECK(q.kv_scale_margin == 4.0);  // docs/fp8-kv-cache.md, "Choosing `--kv-scale-margin`"
  CHECK(c.kv_bf16_window_tensors == KvWindowTensors::k);
  CHECK(c.kv_rotation == KvRotation::hadamard);  // docs/fp8-kv-cache.md, "Rotation"
  CHECK(parse_command_line({"serve", "m", "--kv-rotation", "none"}).kv_rotation == KvRotation::none);
}

TEST_CASE("bad values name the flag and the accepted range", "[config]") {
  CHECK(message_of({"serve", "m", "--port", "70000"}) == "--port: must be in [1, 65535], got 70000");
  CHECK(message_of({"serve", "m", "--port", "80x"}) == "--port: expected an integer in [1, 65535], got '80x'");
  CHECK(message_of({"serve", "m", "--kv-cache-dtype", "fp16"}) ==
        "--kv-cache-dtype: must be one of fp8_e4m3, bf16, got 'fp16'");
  CHECK(message_of({"serve", "m", "--block-size", "12"}) == "--block-size: must be 8, 16 or 32, got 12");
  CHECK(message_of({"serve", "m", "--quantization", "int4"}) == "--quantization: must be one of none, fp8, got 'int4'");
  CHECK(message_of({"serve", "m", "--kv-bf16-window", "24"}) ==
        "--kv-bf16-window: must be a multiple of --block-size (16), got 24");
  CHECK(message_of({"serve", "m", "--kv-bf16-window", "24", "--block-size", "8"}) == "no error");
  CHECK(message_of({"serve", "m", "--kv-bf16-window", "-16"}) == "--kv-bf16-window: must be in [0, 4096], got -16");
  CHECK(message_of({"serve", "m", "--kv-bf16-window-tensors", "v"}) ==
        "--kv-bf16-window-tensors: must be one of k, kv, got 'v'");
  CHECK(message_of({"serve", "m", "--kv-scale-margin", "nan"}).rfind("--kv-scale-margin: expected a number", 0) == 0);
  CHECK(message_of({"serve", "m", "--kv-bf16-window-share", "0.95"}) == "--kv-bf16-window-share: must be in [0.01, 0.9], got 0.95");
  CHECK(message_of({"serve", "m", "--kv-bf16-window-share", "0.5"}) == "no error");
  CHECK(message_of({"serve", "m", "--kv-rotation", "random"}) == "--kv-rotation: must be one of none, hadamard, got 'random'");
  CHECK(message_of({"serve", "m", "--bogus"}) == "unknown flag --bogus (see fp8serve serve --help)");
  CHECK(message_of({"serve"}) == "missing MODEL: a Hugging Face model folder or a .gguf file");
  CHECK(message_of({"train", "m"}) == "unknown command 'train': expected inspect, generate or serve");
  CHECK(message_of({"generate", "m"}) == "--prompt: generate needs a non-empty --prompt");
  CHECK(message_of({"serve", "m", "--port"}) == "--port: needs a value");
}

TEST_CASE("byte counts take 1000- and 1024-based units", "[config]") {
  auto kv_memory = [](const std::string& value) {
    return parse_command_line({"serve", "m", "--kv-cache-memory", value}).kv_cache_memory;
  };
  CHECK(kv_memory("1073741824") == 1073741824);
  CHECK(kv_memory("1GiB") == 1073741824);
  CHECK(kv_memory("1Gi") == 1073741824);
  CHECK(kv_memory("64MiB") == 64 << 20);
  CHECK(kv_memory("512MB") == 512'000'000);
  CHECK(kv_memory("2G") == 2'000'000'000);
  CHECK(kv_memory("3k") == 3000);
  CHECK(kv_memory("7B") == 7);
  CHECK(kv_memory("0") == 0);
  CHECK(parse_command_line({"serve", "m", "--max-body-bytes", "8MiB"}).max_body_bytes == 8 << 20);
  for (const char* bad : {"", "GiB", "1.5GiB", "-1", "1 GiB", "1gib", "1GiBB", "1Mb", "12345678901234567"}) {
    INFO(bad);
    CHECK_THROWS_WITH(kv_memory(bad), Catch::Matchers::StartsWith("--kv-cache-memory: expected a byte count"));
  }
  CHECK_THROWS_WITH(kv_memory("2000TiB"), "--kv-cache-memory: must be in [0, 1e+15], got 2000TiB");
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--max-body-bytes", "1000B"}).max_body_bytes,
                    Catch::Matchers::StartsWith("--max-body-bytes: must be in [1024"));
}

TEST_CASE("--config file is applied first and the command line overrides it", "[config]") {
  const std::string path = "test_config_tmp.json";
  {
    std::ofstream out(path);
    out << R"({"port": 8123, "kv-cache-dtype": "bf16", "enable-prefix-caching": false, "kv-scale-margin": 2})";
  }
  const auto c = parse_command_line({"serve", "m", "--port", "8200", "--config", path});
  CHECK(c.port == 8200);
  CHECK(c.kv_cache_dtype == KvDtype::bf16);
  CHECK_FALSE(c.enable_prefix_caching);
  CHECK(c.kv_scale_margin == 2.0);  // from the file, not the default (4)

  {
    std::ofstream out(path);
    out << R"({"port": "many"})";
  }
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--config", path}),
                    "--port: expected an integer in [1, 65535], got 'many'");
  {
    std::ofstream out(path);
    out << R"({"nonsense": 1})";
  }
  CHECK_THROWS_AS(parse_command_line({"serve", "m", "--config", path}), ConfigError);
  {
    std::ofstream out(path);
    out << "{not json";
  }
  CHECK_THROWS_AS(parse_command_line({"serve", "m", "--config", path}), ConfigError);
  std::remove(path.c_str());
}

TEST_CASE("FP8SERVE_<FLAG> variables set flags: over --config, under the command line", "[config]") {
  const std::string path = "test_config_env_tmp.json";
  {
    std::ofstream out(path);
    out << R"({"port": 8123, "max-num-seqs": 7})";
  }
  const fp8serve::Environment env = {{"FP8SERVE_HOST", "0.0.0.0"},
                                     {"FP8SERVE_PORT", "9001"},
                                     {"FP8SERVE_KV_CACHE_DTYPE", "bf16"},
                                     {"FP8SERVE_NO_ENABLE_PREFIX_CACHING", "true"},
                                     {"FP8SERVE_SHUTDOWN_TIMEOUT", ""},  // empty: unset (compose's ${VAR:-})
                                     {"FP8SERVE_BIN", "/usr/bin/fp8serve"}};  // not a flag: ignored
  auto c = parse_command_line({"serve", "m", "--config", path}, env);
  CHECK(c.host == "0.0.0.0");
  CHECK(c.port == 9001);  // the environment over the file
  CHECK(c.max_num_seqs == 7);
  CHECK(c.kv_cache_dtype == KvDtype::bf16);
  CHECK_FALSE(c.enable_prefix_caching);
  CHECK(c.shutdown_timeout == 30.0);
  CHECK(c.environment_variables ==
        std::vector<std::string>{"FP8SERVE_KV_CACHE_DTYPE", "FP8SERVE_NO_ENABLE_PREFIX_CACHING", "FP8SERVE_HOST", "FP8SERVE_PORT"});

  c = parse_command_line({"serve", "m", "--host", "127.0.0.1", "--port=8200"}, env);
  CHECK(c.host == "127.0.0.1");  // the command line over the environment
  CHECK(c.port == 8200);
  std::remove(path.c_str());

  CHECK_THROWS_WITH(parse_command_line({"serve", "m"}, {{"FP8SERVE_PORT", "http"}}),
                    "environment FP8SERVE_PORT: --port: expected an integer in [1, 65535], got 'http'");
  CHECK(parse_command_line({"serve", "m"}, {{"FP8SERVE_API_KEY", "sk-env"}}).api_key == "sk-env");
}

TEST_CASE("--api-key-file reads the key from a file, once and never empty", "[config]") {
  const std::string path = "test_config_key_tmp.txt";
  {
    std::ofstream out(path);
    out << "sk-from-file\n";  // an editor's final newline is not part of the key
  }
  CHECK(parse_command_line({"serve", "m", "--api-key-file", path}).api_key == "sk-from-file");
  CHECK(parse_command_line({"serve", "m"}, {{"FP8SERVE_API_KEY_FILE", path}}).api_key == "sk-from-file");
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--api-key", "k", "--api-key-file", path}),
                    "--api-key-file: give the key once: --api-key or --api-key-file, not both");
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--api-key-file", path}, {{"FP8SERVE_API_KEY", "k"}}),
                    "--api-key-file: give the key once: --api-key or --api-key-file, not both");
  {
    std::ofstream out(path);
    out << " \n";
  }
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--api-key-file", path}),
                    "--api-key-file: '" + path + "' is empty");
  std::remove(path.c_str());
  CHECK_THROWS_WITH(parse_command_line({"serve", "m", "--api-key-file", path}),
                    "--api-key-file: cannot open '" + path + "'");
}

TEST_CASE("flag_environment reads exactly the FP8SERVE_<FLAG> variables", "[config]") {
  ::setenv("FP8SERVE_MAX_NUM_SEQS", "5", 1);
  ::setenv("FP8SERVE_NOT_A_FLAG", "x", 1);
  const auto env = fp8serve::flag_environment();
  ::unsetenv("FP8SERVE_MAX_NUM_SEQS");
  ::unsetenv("FP8SERVE_NOT_A_FLAG");
  CHECK(env.at("FP8SERVE_MAX_NUM_SEQS") == "5");
  CHECK(env.count("FP8SERVE_NOT_A_FLAG") == 0);
  CHECK(parse_command_line({"serve", "m"}, env).max_num_seqs == 5);
}

TEST_CASE("a flag the command does not use is an error, not silently ignored", "[config]") {
  CHECK(message_of({"generate", "m", "--prompt", "p", "--port", "9000"}) ==
        "--port: generate does not use it (a flag of serve; see fp8serve --help)");
  CHECK(message_of({"serve", "m", "--temperature", "0.5"}) ==
        "--temperature: serve does not use it (a flag of generate; see fp8serve --help)");
  CHECK(message_of({"inspect", "m", "--kv-cache-dtype", "bf16"}) ==
        "--kv-cache-dtype: inspect does not use it (a flag of generate and serve; see fp8serve --help)");
  CHECK(message_of({"inspect", "m", "--log-level", "warn"}) == "no error");
  CHECK(message_of({"generate", "m", "--prompt", "p", "--kv-cache-dtype", "bf16"}) == "no error");
  // One --config file may hold keys of several commands: the ones this command does not read are skipped.
  const std::string path = "test_config_shared.json";
  {
    std::ofstream out(path);
    out << R"({"port": 8123, "temperature": 0.5, "kv-cache-dtype": "bf16"})";
  }
  const auto serve = parse_command_line({"serve", "m", "--config", path});
  CHECK((serve.port == 8123 && serve.temperature == 0.0 && serve.kv_cache_dtype == KvDtype::bf16));
  const auto generate = parse_command_line({"generate", "m", "--prompt", "p", "--config", path});
  CHECK((generate.port == 8000 && generate.temperature == 0.5));
  std::remove(path.c_str());
  CHECK(fp8serve::usage().find("\n serve:\n") != std::string::npos);
  // Likewise the environment (a container's variables may serve several commands).
  CHECK(parse_command_line({"generate", "m", "--prompt", "p"}, {{"FP8SERVE_PORT", "9000"}}).port == 8000);
}

TEST_CASE("draft-model speculation: flags and --config keys, the model required", "[config][spec]") {
  const std::string path = "test_config_draft_tmp.json";
  {
    std::ofstream out(path);
    out << R"({"speculative-method": "draft", "speculative-model": "draft.gguf", "num-speculative-tokens": 3})";
  }
  const auto c = parse_command_line({"serve", "m", "--config", path});
  CHECK(c.speculative_method == SpeculativeMethod::draft);
  CHECK(c.speculative_model == "draft.gguf");
  CHECK(c.num_speculative_tokens == 3);
  std::remove(path.c_str());
  CHECK(message_of({"serve", "m", "--speculative-method", "draft"}) ==
        "--speculative-method: draft needs --speculative-model PATH (a model with the same tokenizer)");
  CHECK(message_of({"serve", "m", "--speculative-model", "d.gguf"}) == "--speculative-model: needs --speculative-method draft");
  CHECK(message_of({"serve", "m", "--speculative-method", "draft", "--speculative-model", "d.gguf"}) == "no error");
}

TEST_CASE("help: each command's usage lists the flags it takes, and only those", "[config][cli]") {
  using fp8serve::Command;
  using fp8serve::help_requested;
  using fp8serve::usage;
  const std::string all = usage();
  // The flag names a usage text lists, one per line that starts with "  --".
  auto flags_of = [](const std::string& text) {
    std::vector<std::string> names;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("  --", 0) == 0) names.push_back(line.substr(2, line.find(' ', 2) - 2));
    return names;
  };
  const std::vector<std::string> every = flags_of(all);
  for (const Command command : {Command::inspect, Command::generate, Command::serve}) {
    const std::string text = usage(command);
    const std::string word = command == Command::inspect ? "inspect" : command == Command::generate ? "generate" : "serve";
    INFO(word);
    CHECK(text.rfind("usage: fp8serve " + word + " MODEL", 0) == 0);
    // A flag is listed for a command exactly when the command line of that command accepts it.
    for (const std::string& flag : every) {
      if (flag == "--config") continue;
      std::vector<std::string> args{word, "m", flag};
      if (command == Command::generate && flag != "--prompt") args.insert(args.end(), {"--prompt", "p"});
      std::string why;
      try {
        parse_command_line(args);
      } catch (const fp8serve::ConfigError& e) {
        why = e.what();
      }
      const bool refused = why.find(word + " does not use it") != std::string::npos;
      const auto listed = flags_of(text);
      CHECK((std::find(listed.begin(), listed.end(), flag) != listed.end()) == !refused);
    }
    CHECK(help_requested({word, "--help"}) == text);
    CHECK(help_requested({word, "MODEL", "--port", "1", "-h"}) == text);
    CHECK(help_requested({"help", word}) == text);
  }
  CHECK(flags_of(usage(Command::serve)).size() < every.size());
  CHECK(help_requested({"--help"}) == all);
  CHECK(help_requested({"help"}) == all);
  CHECK(help_requested({"nonsense", "--help"}) == all);
  CHECK_FALSE(help_requested({"serve", "m", "--port", "8001"}).has_value());
  CHECK_FALSE(help_requested({}).has_value());
}

TEST_CASE("--ignore-request-fields: a comma-separated list, or a list in --config", "[config]") {
  CHECK(parse_command_line({"serve", "m", "--ignore-request-fields", "no_stop_trim,rid"}).ignore_request_fields ==
        std::vector<std::string>{"no_stop_trim", "rid"});
  CHECK(parse_command_line({"serve", "m"}).ignore_request_fields.empty());
  CHECK_THROWS_AS(parse_command_line({"serve", "m", "--ignore-request-fields", "a,,b"}), fp8serve::ConfigError);
  CHECK_THROWS_AS(parse_command_line({"serve", "m", "--ignore-request-fields", "a b"}), fp8serve::ConfigError);
  CHECK_THROWS_AS(parse_command_line({"generate", "m", "--prompt", "p", "--ignore-request-fields", "a"}), fp8serve::ConfigError);
  const std::string path = "test_config_ignored_tmp.json";
  {
    std::ofstream out(path);
    out << R"({"ignore-request-fields": ["no_stop_trim", "rid"]})";
  }
  CHECK(parse_command_line({"serve", "m", "--config", path}).ignore_request_fields == std::vector<std::string>{"no_stop_trim", "rid"});
  std::remove(path.c_str());
}

TEST_CASE("--kv-events-config: vLLM's JSON, each key checked; needs the prefix cache", "[config]") {
  const auto off = parse_command_line({"serve", "m"}).kv_events;
  CHECK_FALSE(off.enable_kv_cache_events);
  CHECK(off.endpoint == "tcp://*:5557");  // vLLM's defaults
  CHECK(off.publisher == "zmq");
  CHECK(off.buffer_steps == 10000);
  const auto on = parse_command_line({"serve", "m", "--kv-events-config",
                                      R"({"enable_kv_cache_events": true, "endpoint": "tcp://*:6000", "topic": "kv@a:1@m",
                                          "replay_endpoint": "tcp://*:6001", "buffer_steps": 5, "hwm": 7, "max_queue_size": 9,
                                          "publisher": "null"})"})
                      .kv_events;
  CHECK(on.enable_kv_cache_events);
  CHECK(on.endpoint == "tcp://*:6000");
  CHECK(on.topic == "kv@a:1@m");
  CHECK(on.replay_endpoint == "tcp://*:6001");
  CHECK(on.buffer_steps == 5);
  CHECK(on.hwm == 7);
  CHECK(on.max_queue_size == 9);
  CHECK(on.publisher == "null");
  auto fails_with = [](std::vector<std::string> args, const std::string& text) {
    try {
      parse_command_line(args);
    } catch (const fp8serve::ConfigError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(text) != std::string::npos);
      return;
    }
    FAIL("no error for " << args.back());
  };
  fails_with({"serve", "m", "--kv-events-config", R"({"endpont": "x"})"}, "unknown key 'endpont'");
  fails_with({"serve", "m", "--kv-events-config", "on"}, "expected a JSON object");
  fails_with({"serve", "m", "--kv-events-config", "[1]"}, "expected a JSON object");
  fails_with({"serve", "m", "--kv-events-config", R"({"buffer_steps": 0})"}, "'buffer_steps' must be an integer");
  fails_with({"serve", "m", "--kv-events-config", R"({"publisher": "kafka"})"}, "'publisher' must be");
  fails_with({"serve", "m", "--kv-events-config", R"({"enable_kv_cache_events": "yes"})"}, "must be true or false");
  fails_with({"serve", "m", "--kv-events-config", R"({"enable_kv_cache_events": true, "endpoint": ""})"}, "'endpoint' must not be empty");
  fails_with({"serve", "m", "--no-enable-prefix-caching", "--kv-events-config", R"({"enable_kv_cache_events": true})"},
             "need --enable-prefix-caching");
  fails_with({"generate", "m", "--prompt", "p", "--kv-events-config", "{}"}, "generate does not use it");
  // In a --config file, as an object or as its text.
  const std::string path = "test_config_events_tmp.json";
  {
    std::ofstream out(path);
    out << R"({"kv-events-config": {"enable_kv_cache_events": true, "topic": "t"}})";
  }
  const auto from_file = parse_command_line({"serve", "m", "--config", path}).kv_events;
  std::remove(path.c_str());
  CHECK(from_file.enable_kv_cache_events);
  CHECK(from_file.topic == "t");
}
