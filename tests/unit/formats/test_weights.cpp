// Weight loading: safetensors dtype conversion against ml_dtypes, GGUF renaming, validation
// reports, the default model against transformers' own GGUF loader (which also undoes the Q/K
// permutation), and the tiny Llama loading to identical weights from HF and GGUF files.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>

#include "model/formats/dequant.hpp"
#include "model/formats/gguf.hpp"
#include "model/formats/safetensors.hpp"
#include "model/formats/weights.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using fp8serve::test::formats_fixture;

namespace {

const std::string kDefaultModel =
    std::string(FP8SERVE_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

ModelConfig small_config(Family family) {
  ModelConfig c;
  c.family = family;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.vocab_size = 10;
  c.max_position_embeddings = 64;
  c.attention_bias = family == Family::qwen2;
  c.qk_norm = family == Family::qwen3;
  return c;
}

ModelWeights weights_for(const ModelConfig& c) {
  ModelWeights w;
  for (const auto& [name, shape] : expected_weight_shapes(c)) {
    HostTensor t{name, shape, {}};
    t.data.assign(static_cast<size_t>(t.num_elements()), 0x3f80);
    w.tensors.emplace(name, std::move(t));
  }
  return w;
}

}  // namespace

TEST_CASE("safetensors tensors convert to bf16 like ml_dtypes", "[weights]") {
  const SafetensorsFile f = SafetensorsFile::open(formats_fixture("tiny.safetensors"));
  const auto expected = test::read_json(formats_fixture("tiny.safetensors.json"));
  for (const auto& [name, e] : expected.items()) {
    INFO("tensor " << name);
    const HostTensor t = host_tensor_from_safetensors(*f.find(name));
    CHECK(t.name == name);
    CHECK(t.shape == e["shape"].get<std::vector<int64_t>>());
    CHECK(t.data == e["bf16"].get<std::vector<uint16_t>>());
  }
  CHECK_THROWS_WITH(host_tensor_from_safetensors(*f.find("w_i64")),
                    Catch::Contains("w_i64") && Catch::Contains("I64"));
}

TEST_CASE("GGUF tensor names map to HF names", "[weights]") {
  CHECK(hf_name_from_gguf("token_embd.weight") == "model.embed_tokens.weight");
  CHECK(hf_name_from_gguf("output.weight") == "lm_head.weight");
  CHECK(hf_name_from_gguf("output_norm.weight") == "model.norm.weight");
  CHECK(hf_name_from_gguf("blk.0.attn_q.weight") == "model.layers.0.self_attn.q_proj.weight");
  CHECK(hf_name_from_gguf("blk.12.attn_k.bias") == "model.layers.12.self_attn.k_proj.bias");
  CHECK(hf_name_from_gguf("blk.3.attn_output.weight") == "model.layers.3.self_attn.o_proj.weight");
  CHECK(hf_name_from_gguf("blk.3.attn_q_norm.weight") == "model.layers.3.self_attn.q_norm.weight");
  CHECK(hf_name_from_gguf("blk.29.ffn_down.weight") == "model.layers.29.mlp.down_proj.weight");
  CHECK(hf_name_from_gguf("blk.1.ffn_norm.weight") ==
        "model.layers.1.post_attention_layernorm.weight");
  CHECK(hf_name_from_gguf("blk.1.attn_norm.weight") == "model.layers.1.input_layernorm.weight");
  CHECK(hf_name_from_gguf("blk..attn_q.weight").empty());
  CHECK(hf_name_from_gguf("blk.01.attn_q.weight").empty());
  CHECK(hf_name_from_gguf("blk.x.attn_q.weight").empty());
  CHECK(hf_name_from_gguf("blk.1.attn_qkv.weight").empty());
  CHECK(hf_name_from_gguf("rope_freqs.weight").empty());
}

TEST_CASE("validate_weights names missing, extra and misshapen tensors", "[weights]") {
  for (Family family : {Family::llama, Family::qwen2, Family::qwen3}) {
    const ModelConfig c = small_config(family);
    ModelWeights w = weights_for(c);
    CHECK_NOTHROW(validate_weights(w, c));
    CHECK(w.tensors.count("lm_head.weight") == 1);
  }
  const ModelConfig c = small_config(Family::qwen2);
  CHECK(expected_weight_shapes(c).at("model.layers.1.self_attn.k_proj.bias") ==
        std::vector<int64_t>{4});
  ModelWeights w = weights_for(c);
  w.tensors.erase("model.layers.1.self_attn.v_proj.bias");
  w.tensors["model.layers.0.mlp.up_proj.weight"].shape = {8, 12};
  w.tensors["model.layers.5.mlp.up_proj.weight"] = {"model.layers.5.mlp.up_proj.weight", {1}, {0}};
  const WeightProblems p = check_weights(w, c);
  CHECK(p.missing == std::vector<std::string>{"model.layers.1.self_attn.v_proj.bias"});
  CHECK(p.extra == std::vector<std::string>{"model.layers.5.mlp.up_proj.weight"});
  REQUIRE(p.misshapen.size() == 1);
  CHECK(p.misshapen[0] == "model.layers.0.mlp.up_proj.weight: got [8, 12], expected [12, 8]");
  CHECK_THROWS_WITH(validate_weights(w, c), Catch::Contains("v_proj.bias") &&
                                                Catch::Contains("layers.5") &&
                                                Catch::Contains("up_proj"));
  CHECK_THROWS_WITH(w.at("nope"), Catch::Contains("nope"));
}

TEST_CASE("tied embeddings: lm_head may be absent, or present only as a copy", "[weights]") {
  ModelConfig c = small_config(Family::llama);
  c.tie_word_embeddings = true;
  ModelWeights w = weights_for(c);
  CHECK(w.tensors.count("lm_head.weight") == 0);
  CHECK_NOTHROW(validate_weights(w, c));
  HostTensor copy = w.at("model.embed_tokens.weight");
  copy.name = "lm_head.weight";
  w.tensors.emplace("lm_head.weight", copy);
  CHECK_NOTHROW(validate_weights(w, c));
  w.tensors["lm_head.weight"].data[3] = 0;  // held in memory: data is the tensor
  CHECK_THROWS_WITH(validate_weights(w, c), Catch::Contains("lm_head.weight"));
}

TEST_CASE("tiny Llama: HF directory and GGUF twin give identical weights", "[weights][model]") {
  const std::string dir = std::string(FP8SERVE_FIXTURES_DIR) + "/models/tiny-llama";
  const std::string gguf_path = std::string(FP8SERVE_FIXTURES_DIR) + "/models/tiny-llama.gguf";
  if (!test::file_exists(dir + "/config.json") || !test::file_exists(gguf_path)) {
    WARN("tiny-llama fixtures not present yet; skipping");
    return;
  }
  const ModelConfig hf_config = load_hf_config(dir);
  const auto gguf_file = std::make_shared<const GgufFile>(GgufFile::open(gguf_path));
  const GgufFile& gguf = *gguf_file;
  const ModelConfig gguf_config = parse_gguf_config(gguf);
  CHECK(gguf_config.num_layers == hf_config.num_layers);
  CHECK(gguf_config.hidden_size == hf_config.hidden_size);
  CHECK(gguf_config.num_kv_heads == hf_config.num_kv_heads);
  CHECK(gguf_config.head_dim == hf_config.head_dim);
  CHECK(gguf_config.vocab_size == hf_config.vocab_size);
  CHECK(gguf_config.rope_theta == hf_config.rope_theta);
  CHECK(gguf_config.rms_norm_eps == hf_config.rms_norm_eps);
  CHECK(gguf_config.tie_word_embeddings == hf_config.tie_word_embeddings);
  // llama3 rope scaling survives the trip through llama.cpp's rope_freqs divisors.
  CHECK(hf_config.rope_scaling.kind == RopeScaling::Kind::llama3);
  CHECK(gguf_config.rope_scaling.kind == RopeScaling::Kind::llama3);
  CHECK(gguf_config.rope_scaling.factor == hf_config.rope_scaling.factor);
  CHECK(gguf_config.rope_scaling.low_freq_factor == hf_config.rope_scaling.low_freq_factor);
  CHECK(gguf_config.rope_scaling.high_freq_factor == hf_config.rope_scaling.high_freq_factor);
  CHECK(gguf_config.rope_scaling.original_max_position_embeddings ==
        hf_config.rope_scaling.original_max_position_embeddings);

  const ModelWeights from_hf = load_hf_weights(dir, hf_config);
  const ModelWeights from_gguf = load_gguf_weights(gguf_file, gguf_config);
  REQUIRE(from_hf.tensors.size() == from_gguf.tensors.size());
  for (const auto& [name, t] : from_hf.tensors) {
    INFO("tensor " << name);
    const HostTensor* g = from_gguf.find(name);
    REQUIRE(g != nullptr);
    CHECK(g->shape == t.shape);
    CHECK(g->to_bf16() == t.to_bf16());  // bit-identical, Q/K rows included
  }
}

TEST_CASE("default model: every tensor loads, validates and matches transformers",
          "[weights][model]") {
  if (!test::file_exists(kDefaultModel)) {
    WARN("default model not present at " << kDefaultModel << "; skipping");
    return;
  }
  const auto ref = test::read_json(formats_fixture("smollm2_reference.json"));
  const auto gguf_file = std::make_shared<const GgufFile>(GgufFile::open(kDefaultModel));
  const GgufFile& gguf = *gguf_file;
  std::map<std::string, int> types;
  for (const auto& t : gguf.tensors()) types[std::string(ggml_type_name(t.type))]++;
  CHECK(types == ref["tensor_types"].get<std::map<std::string, int>>());
  const ModelConfig config = parse_gguf_config(gguf);
  CHECK(num_parameters(config) == ref["num_parameters"].get<uint64_t>());

  const auto start = std::chrono::steady_clock::now();
  const ModelWeights w = load_gguf_weights(gguf_file, config);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  WARN("loaded " << w.tensors.size() << " tensors, " << w.num_bytes() / 1e6 << " MB bf16 in "
                 << seconds << " s");
  CHECK(w.tensors.size() == 272);  // tied: no lm_head
  uint64_t elements = 0;
  for (const auto& [name, t] : w.tensors) elements += static_cast<uint64_t>(t.num_elements());
  CHECK(elements == num_parameters(config));

  for (const auto& [name, sample] : ref["samples"].items()) {
    INFO("tensor " << name);
    const HostTensor& tensor = w.at(name);
    const HostTensor t{tensor.name, tensor.shape, tensor.to_bf16(), nullptr};
    CHECK(t.shape == sample["shape"].get<std::vector<int64_t>>());
    const int64_t cols = t.num_elements() / t.shape[0];
    for (const auto& [row, values] : sample["rows"].items()) {
      INFO("row " << row);
      const auto r = static_cast<size_t>(std::stoll(row));
      const auto n = std::min<size_t>(16, static_cast<size_t>(cols));
      REQUIRE((r + 1) * static_cast<size_t>(cols) <= t.data.size());
      const std::vector<uint16_t> got(t.data.begin() + static_cast<ptrdiff_t>(r * cols),
                                      t.data.begin() + static_cast<ptrdiff_t>(r * cols + n));
      CHECK(got == values.get<std::vector<uint16_t>>());
    }
    double sum = 0;
    for (uint16_t b : t.data) sum += bf16_to_f32(b);
    CHECK(sum == Approx(sample["bf16_sum"].get<double>()).epsilon(1e-9).margin(1e-6));
  }
}

TEST_CASE("tiny models of each family load and validate from HF directories",
          "[weights][model]") {
  for (const char* name : {"tiny-llama", "tiny-qwen2", "tiny-qwen3"}) {
    INFO("model " << name);
    const std::string dir = std::string(FP8SERVE_FIXTURES_DIR) + "/models/" + name;
    const std::string ref_path = std::string(FP8SERVE_FIXTURES_DIR) + "/reference/" + name + ".json";
    if (!test::file_exists(dir + "/config.json") || !test::file_exists(ref_path)) {
      WARN(name << " fixtures not present yet; skipping");
      continue;
    }
    // The facts transformers reported when it made the reference outputs.
    const auto facts = test::read_json(ref_path)["config"];
    const ModelConfig c = load_hf_config(dir);
    CHECK(c.architecture == facts["architectures"][0].get<std::string>());
    CHECK(c.hidden_size == facts["hidden_size"].get<int>());
    CHECK(c.num_layers == facts["num_hidden_layers"].get<int>());
    CHECK(c.num_heads == facts["num_attention_heads"].get<int>());
    CHECK(c.num_kv_heads == facts["num_key_value_heads"].get<int>());
    const bool has_head_dim = facts.contains("head_dim") && !facts["head_dim"].is_null();
    CHECK(c.head_dim == (has_head_dim ? facts["head_dim"].get<int>() : c.hidden_size / c.num_heads));
    CHECK(c.intermediate_size == facts["intermediate_size"].get<int>());
    CHECK(c.vocab_size == facts["vocab_size"].get<int>());
    CHECK(c.rope_theta == static_cast<float>(facts["rope_theta"].get<double>()));
    CHECK(c.rms_norm_eps == static_cast<float>(facts["rms_norm_eps"].get<double>()));
    CHECK(c.tie_word_embeddings == facts["tie_word_embeddings"].get<bool>());
    const ModelWeights w = load_hf_weights(dir, c);  // validates
    uint64_t elements = 0;
    for (const auto& [tensor, t] : w.tensors) elements += static_cast<uint64_t>(t.num_elements());
    CHECK(elements == num_parameters(c));
  }
}
