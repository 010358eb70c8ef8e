// `fp8serve generate` end to end on a tiny model (its text goes to stdout, the summary to stderr).
#include "engine_test_util.hpp"
#include "server/generate.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

TEST_CASE("generate runs the engine on a prompt and exits 0", "[engine][generate]") {
  spdlog::set_level(spdlog::level::warn);
  Config config;
  config.command = Command::generate;
  config.model = fixture("models/tiny-llama");
  config.prompt = "Hello world";
  config.max_tokens = 8;
  config.threads = 2;
  config.max_model_len = 256;
  config.kv_cache_memory = 1 << 20;
  CHECK(run_generate(config) == 0);
  config.kv_cache_dtype = KvDtype::bf16;
  config.temperature = 0.8;
  config.seed = 3;
  CHECK(run_generate(config) == 0);
}

TEST_CASE("generate refuses what this build cannot do, with a message", "[engine][generate]") {
  Config config;
  config.command = Command::generate;
  config.model = fixture("models/tiny-llama");
  config.prompt = "Hello";
  config.device = "cuda";
  CHECK_THROWS_AS(run_generate(config), ConfigError);
  config.device = "cpu";
  config.max_model_len = 4;  // the prompt + 64 tokens cannot fit: the request fails, exit 1
  config.kv_cache_memory = 1 << 20;
  CHECK(run_generate(config) == 1);
}
