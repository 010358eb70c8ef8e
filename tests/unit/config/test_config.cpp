#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>

#include "config/config.hpp"

using fp8serve::Command;
using fp8serve::ConfigError;
using fp8serve::parse_command_line;

TEST_CASE("defaults and flags of every kind parse", "[config]") {
  const auto c = parse_command_line({"serve", "model.gguf", "--port", "9000", "--kv-cache-dtype=bf16",
                                     "--kv-scale-margin", "2.5", "--no-enable-prefix-caching", "--seed", "18446744073709551615"});
  CHECK(c.command == Command::serve);
  CHECK(c.model == "model.gguf");
  CHECK(c.port == 9000);
  CHECK(c.kv_cache_dtype == "bf16");
  CHECK(c.kv_scale_margin == 2.5);
  CHECK_FALSE(c.enable_prefix_caching);
  CHECK(c.seed == 18446744073709551615ull);
  CHECK(c.host == "127.0.0.1");  // loopback unless told otherwise
  CHECK(c.block_size == 16);
  CHECK(c.quantization == "none");  // weights as stored unless told otherwise
  CHECK_FALSE(c.fp8_lm_head);
  const auto q = parse_command_line({"serve", "m", "--quantization", "fp8", "--fp8-lm-head"});
  CHECK(q.quantization == "fp8");
  CHECK(q.fp8_lm_head);
}

TEST_CASE("bad values name the flag and the accepted range", "[config]") {
  auto message_of = [](std::vector<std::string> args) {
    try {
      parse_command_line(args);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message_of({"serve", "m", "--port", "70000"}) == "--port: must be in [1, 65535], got 70000");
  CHECK(message_of({"serve", "m", "--port", "80x"}) == "--port: expected an integer in [1, 65535], got '80x'");
  CHECK(message_of({"serve", "m", "--kv-cache-dtype", "fp16"}) ==
        "--kv-cache-dtype: must be one of fp8_e4m3, bf16, got 'fp16'");
  CHECK(message_of({"serve", "m", "--block-size", "12"}) == "--block-size: must be 8, 16 or 32, got 12");
  CHECK(message_of({"serve", "m", "--quantization", "int4"}) == "--quantization: must be one of none, fp8, got 'int4'");
  CHECK(message_of({"serve", "m", "--kv-scale-margin", "nan"}).rfind("--kv-scale-margin: expected a number", 0) == 0);
  CHECK(message_of({"serve", "m", "--bogus"}) == "unknown flag --bogus (see fp8serve --help)");
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
  CHECK(c.kv_cache_dtype == "bf16");
  CHECK_FALSE(c.enable_prefix_caching);
  CHECK(c.kv_scale_margin == 2.0);

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
