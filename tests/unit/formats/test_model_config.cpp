// Model config: HF configs written by transformers (expected facts and parameter counts from
// transformers itself), GGUF metadata, and every unsupported or malformed case.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "model/formats/gguf.hpp"
#include "model/formats/model_config.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;
using nlohmann::json;

namespace {

json config_of(const std::string& name) {
  return test::read_json(formats_fixture("configs/" + name + "/config.json"));
}

void require_error(const json& config, const std::string& needle) {
  try {
    parse_hf_config(config, nullptr);
    FAIL("expected a FormatError mentioning '" << needle << "'");
  } catch (const FormatError& e) {
    INFO("message: " << e.what());
    CHECK(std::string(e.what()).find(needle) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("HF config.json of each family matches transformers", "[config]") {
  const auto expected = test::read_json(formats_fixture("configs/expected.json"));
  for (const auto& [name, e] : expected.items()) {
    INFO("config " << name);
    const ModelConfig c = load_hf_config(formats_fixture("configs/" + name));
    CHECK(c.architecture == e["architecture"].get<std::string>());
    CHECK(c.hidden_size == e["hidden_size"].get<int>());
    CHECK(c.intermediate_size == e["intermediate_size"].get<int>());
    CHECK(c.num_layers == e["num_layers"].get<int>());
    CHECK(c.num_heads == e["num_heads"].get<int>());
    CHECK(c.num_kv_heads == e["num_kv_heads"].get<int>());
    CHECK(c.head_dim == e["head_dim"].get<int>());
    CHECK(c.vocab_size == e["vocab_size"].get<int>());
    CHECK(c.max_position_embeddings == e["max_position_embeddings"].get<int>());
    CHECK(c.rope_theta == static_cast<float>(e["rope_theta"].get<double>()));
    CHECK(c.rms_norm_eps == static_cast<float>(e["rms_norm_eps"].get<double>()));
    CHECK(c.tie_word_embeddings == e["tie_word_embeddings"].get<bool>());
    CHECK(c.bos_token_id == e["bos_token_id"].get<int>());
    CHECK(c.eos_token_ids == e["eos_token_ids"].get<std::vector<int>>());
    CHECK(num_parameters(c) == e["num_parameters"].get<uint64_t>());
    const bool llama3 = e["rope_type"] == "llama3";
    CHECK((c.rope_scaling.kind == RopeScaling::Kind::llama3) == llama3);
    if (llama3) {
      CHECK(c.rope_scaling.factor == e["rope"]["factor"].get<float>());
      CHECK(c.rope_scaling.low_freq_factor == e["rope"]["low_freq_factor"].get<float>());
      CHECK(c.rope_scaling.high_freq_factor == e["rope"]["high_freq_factor"].get<float>());
      CHECK(c.rope_scaling.original_max_position_embeddings ==
            e["rope"]["original_max_position_embeddings"].get<int>());
    }
  }
  CHECK(load_hf_config(formats_fixture("configs/qwen2")).attention_bias);
  CHECK_FALSE(load_hf_config(formats_fixture("configs/qwen2")).qk_norm);
  CHECK(load_hf_config(formats_fixture("configs/qwen3")).qk_norm);
  CHECK_FALSE(load_hf_config(formats_fixture("configs/llama3")).attention_bias);
}

TEST_CASE("HF config: transformers 4.x layout and generation_config ids", "[config]") {
  json c = config_of("llama3");
  c.erase("rope_parameters");
  c["rope_theta"] = 500000.0;
  c["rope_scaling"] = {{"type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const json gen = {{"bos_token_id", 128000}, {"eos_token_id", {128001, 128008, 128009}}};
  c["vocab_size"] = 128256;
  const ModelConfig m = parse_hf_config(c, &gen);
  CHECK(m.rope_theta == 500000.0f);
  CHECK(m.rope_scaling.factor == 32.0f);
  CHECK(m.bos_token_id == 128000);
  CHECK(m.eos_token_ids == std::vector<int>{128001, 128008, 128009});
  c.erase("rope_scaling");
  c.erase("rope_theta");
  c.erase("num_key_value_heads");
  c.erase("head_dim");
  const ModelConfig d = parse_hf_config(c, nullptr);
  CHECK(d.rope_theta == 10000.0f);  // HF's default
  CHECK(d.num_kv_heads == d.num_heads);
  CHECK(d.head_dim == d.hidden_size / d.num_heads);
  CHECK(d.rope_scaling.kind == RopeScaling::Kind::none);
}

TEST_CASE("HF config: unsupported and malformed configs name the culprit", "[config]") {
  const json llama = config_of("llama3");
  const json qwen2 = config_of("qwen2");
  auto with = [](json c, const std::string& key, const json& value) {
    c[key] = value;
    return c;
  };
  auto without = [](json c, const std::string& key) {
    c.erase(key);
    return c;
  };
  require_error(with(llama, "architectures", {"MistralForCausalLM"}), "MistralForCausalLM");
  require_error(without(without(llama, "architectures"), "model_type"), "architectures");
  require_error(with(without(llama, "architectures"), "model_type", "gemma"), "gemma");
  require_error(with(llama, "rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}), "yarn");
  require_error(with(llama, "rope_parameters", {{"rope_type", "llama3"}, {"factor", 8.0}}),
                "low_freq_factor");
  require_error(with(qwen2, "use_sliding_window", true), "use_sliding_window");
  require_error(with(llama, "sliding_window", 4096), "sliding_window");
  require_error(with(qwen2, "layer_types", {"sliding_attention", "full_attention"}),
                "sliding_attention");
  require_error(with(llama, "hidden_act", "gelu"), "gelu");
  require_error(with(llama, "mlp_bias", true), "mlp_bias");
  require_error(with(llama, "attention_bias", true), "attention_bias");
  require_error(with(llama, "partial_rotary_factor", 0.5), "partial_rotary_factor");
  require_error(without(llama, "hidden_size"), "hidden_size");
  require_error(without(llama, "vocab_size"), "vocab_size");
  require_error(without(qwen2, "num_key_value_heads"), "num_key_value_heads");
  require_error(with(llama, "hidden_size", "256"), "hidden_size");
  require_error(with(llama, "num_hidden_layers", 1.5), "num_hidden_layers");
  require_error(with(llama, "num_hidden_layers", 0), "num_layers");
  require_error(with(llama, "num_key_value_heads", 3), "num_kv_heads");
  require_error(with(llama, "num_attention_heads", 0), "num_attention_heads");
  require_error(with(llama, "head_dim", 33), "head_dim");
  require_error(with(llama, "hidden_size", 1LL << 40), "hidden_size");
  require_error(with(llama, "vocab_size", (1 << 20) + 1), "vocab_size");  // the sampler's sums hold 2^20 terms
  CHECK(parse_hf_config(with(llama, "vocab_size", 1 << 20), nullptr).vocab_size == 1 << 20);
  require_error(with(llama, "eos_token_id", 5000), "eos_token_id");
  require_error(with(llama, "eos_token_id", {1, "x"}), "eos_token_id");
  require_error(with(llama, "rms_norm_eps", -1.0), "rms_norm_eps");
  require_error(json::array(), "object");
  const json bad_gen = {{"eos_token_id", "two"}};
  CHECK_THROWS_WITH(parse_hf_config(llama, &bad_gen), Catch::Contains("eos_token_id"));
  CHECK_THROWS_WITH(load_hf_config("/nonexistent"), Catch::Contains("config.json"));
}

TEST_CASE("GGUF config from metadata, and its unsupported cases", "[config][gguf]") {
  using test::GgufBytes;
  auto build = [](const std::string& arch, const std::vector<std::pair<std::string, uint32_t>>& ints,
                  bool with_bad_rope = false) {
    GgufBytes b;
    b.header(0, ints.size() + 3 + (with_bad_rope ? 1 : 0));
    b.kv_str("general.architecture", arch);
    for (const auto& [k, v] : ints) b.kv_u32(arch + "." + k, v);
    b.kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
    b.kv_f32(arch + ".rope.freq_base", 1e6f);
    if (with_bad_rope) b.kv_str(arch + ".rope.scaling.type", "yarn");
    return GgufFile::from_bytes(b.bytes);
  };
  const std::vector<std::pair<std::string, uint32_t>> base = {
      {"embedding_length", 128}, {"feed_forward_length", 384}, {"block_count", 2},
      {"attention.head_count", 4}, {"attention.head_count_kv", 1}, {"context_length", 4096},
      {"vocab_size", 600}, {"attention.key_length", 48}, {"attention.value_length", 48}};
  const ModelConfig q3 = parse_gguf_config(build("qwen3", base));
  CHECK(q3.family == Family::qwen3);
  CHECK(q3.head_dim == 48);
  CHECK(q3.qk_norm);
  CHECK(q3.tie_word_embeddings);  // no output.weight tensor
  CHECK(q3.rope_theta == 1e6f);
  CHECK(parse_gguf_config(build("qwen2", {base.begin(), base.end() - 2})).attention_bias);
  CHECK_THROWS_WITH(parse_gguf_config(build("gemma", base)), Catch::Contains("gemma"));
  CHECK_THROWS_WITH(parse_gguf_config(build("llama", {base.begin() + 1, base.end()})),
                    Catch::Contains("llama.embedding_length"));
  CHECK_THROWS_WITH(parse_gguf_config(build("qwen3", base, true)), Catch::Contains("yarn"));
  auto partial = base;
  partial.push_back({"rope.dimension_count", 32});
  CHECK_THROWS_WITH(parse_gguf_config(build("qwen3", partial)), Catch::Contains("partial rotary"));
  auto windowed = base;
  windowed.push_back({"attention.sliding_window", 4096});
  CHECK_THROWS_WITH(parse_gguf_config(build("qwen3", windowed)), Catch::Contains("sliding_window"));
}

TEST_CASE("default model: config facts from GGUF metadata", "[config][model]") {
  const std::string path = std::string(FP8SERVE_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!test::file_exists(path)) {
    WARN("default model not present at " << path << "; skipping");
    return;
  }
  const ModelConfig c = parse_gguf_config(GgufFile::open(path));
  CHECK(c.family == Family::llama);
  CHECK(c.architecture == "LlamaForCausalLM");
  CHECK(c.num_layers == 30);
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 49152);
  CHECK(c.max_position_embeddings == 8192);
  CHECK(c.rope_theta == 100000.0f);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK(c.tie_word_embeddings);
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_ids == std::vector<int>{2});
  CHECK(num_parameters(c) == 134515008);  // SmolLM2-135M's published parameter count
}
