// FP8 checkpoints as published (model_config.hpp WeightQuantization, fp8_checkpoint.hpp): the
// tiny fixtures of tests/scripts/make_fp8_fixtures.py load with their codes and scales as stored
// and dequantize to the values ml_dtypes computes; quantization_config keys outside what we read,
// and broken scale tensors, are errors naming the culprit.
#include <catch2/catch.hpp>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/forward_ops.hpp"
#include "model/formats/fp8_checkpoint.hpp"
#include "model/formats/safetensors.hpp"
#include "model/formats/weights.hpp"
#include "tests/unit/formats/format_test_util.hpp"

using namespace fp8serve;
using nlohmann::json;

namespace {

std::string model_dir(const std::string& name) { return std::string(FP8SERVE_FIXTURES_DIR) + "/models/" + name; }

bool is_projection(const std::string& name) {
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    if (name.find(std::string(".") + p + ".weight") != std::string::npos) return true;
  }
  return false;
}

// A copy of a fixture folder in a temporary directory, whose config and tensors a test rewrites.
struct ScratchModel {
  std::filesystem::path dir;
  explicit ScratchModel(const std::string& fixture) {
    dir = std::filesystem::temp_directory_path() /
          ("fp8serve-fp8-" + fixture + "-" + std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    std::filesystem::remove_all(dir);
    std::filesystem::copy(model_dir(fixture), dir);
  }
  ~ScratchModel() { std::filesystem::remove_all(dir); }
  json config() const { return test::read_json((dir / "config.json").string()); }
  void write_config(const json& config) const { std::ofstream(dir / "config.json") << config.dump(); }

  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Tensor> tensors() const {
    const SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    std::map<std::string, Tensor> out;
    for (const SafetensorsTensor& t : f.tensors()) {
      out[t.name] = {std::string(safetensors_dtype_name(t.dtype)), t.shape, {t.data.begin(), t.data.end()}};
    }
    return out;
  }
  void write_tensors(const std::map<std::string, Tensor>& tensors) const {
    json header = json::object();
    std::vector<uint8_t> data;
    for (const auto& [name, t] : tensors) {
      header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
      data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    }
    const std::string text = header.dump();
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  ModelWeights load() const {
    const ModelConfig c = load_hf_config(dir.string());
    return load_hf_weights(dir.string(), c);
  }
};

const char* kQ0 = "model.layers.0.self_attn.q_proj.weight";

}  // namespace

TEST_CASE("FP8 checkpoints load as published and dequantize like ml_dtypes", "[weights][fp8]") {
  const json samples = test::read_json(test::formats_fixture("fp8_checkpoints.json"));
  struct Case {
    const char* name;
    const char* method;
    int64_t block_k;
  };
  for (const Case& c : {Case{"tiny-qwen3-fp8-block", "fp8", 128}, Case{"tiny-llama-fp8-channel", "compressed-tensors", 0},
                        Case{"tiny-qwen2-fp8-tensor", "compressed-tensors", 0}}) {
    INFO(c.name);
    const ModelConfig config = load_hf_config(model_dir(c.name));
    CHECK(config.quantization.fp8);
    CHECK(config.quantization.method == c.method);
    CHECK(config.quantization.block_rows == (c.block_k ? 128 : 0));
    const ModelWeights w = load_hf_weights(model_dir(c.name), config);  // validates: scales are not extra
    for (const auto& [name, t] : w.tensors) {
      INFO(name);
      const Fp8Weight* f = t.fp8();
      REQUIRE((f != nullptr) == is_projection(name));
      if (f == nullptr) continue;
      CHECK(t.stored_type() == "F8_E4M3");
      CHECK(f->block_k == c.block_k);
      CHECK(f->codes.size() == static_cast<std::size_t>(t.num_elements()));
      CHECK(f->scales.size() == static_cast<std::size_t>(t.rows() * weight_num_k_blocks(t.cols(), f->block_k)));
    }
    for (const auto& [name, sample] : samples[c.name].items()) {
      INFO(name);
      const HostTensor& t = w.at(name);
      CHECK(t.shape == sample["shape"].get<std::vector<int64_t>>());
      std::vector<float> rows(static_cast<std::size_t>(t.num_elements()));
      t.read_rows(0, t.rows(), rows.data());
      for (const auto& [row, values] : sample["rows"].items()) {
        const auto r = std::stoll(row);
        const auto expected = values.get<std::vector<float>>();
        for (std::size_t k = 0; k < expected.size(); ++k) {
          REQUIRE(rows[static_cast<std::size_t>(r * t.cols()) + k] == expected[k]);  // exact: one rounding each
        }
      }
      double sum = 0;
      for (const float v : rows) sum += v;
      CHECK(sum == Approx(sample["sum"].get<double>()).epsilon(1e-9));
    }
  }
}

TEST_CASE("quantization_config: what we do not read is an error naming the key", "[config][fp8]") {
  auto config_with = [](const json& qc) {
    json c = test::read_json(model_dir("tiny-qwen3-fp8-block") + "/config.json");
    c["quantization_config"] = qc;
    return c;
  };
  const json block = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                      {"weight_block_size", {128, 128}}};
  CHECK(parse_quantization_config(config_with(block)).block_cols == 128);
  CHECK_FALSE(parse_quantization_config(config_with(nullptr)).fp8);
  const json channel = test::read_json(model_dir("tiny-llama-fp8-channel") + "/config.json")["quantization_config"];
  CHECK(parse_quantization_config(config_with(channel)).fp8);

  struct Bad {
    json qc;
    const char* names;
  };
  auto with = [](json base, const json& patch) {
    base.merge_patch(patch);
    return base;
  };
  auto group = [&](const json& weights_patch) {
    json g = channel;
    g["config_groups"]["group_0"]["weights"].merge_patch(weights_patch);
    return g;
  };
  const std::vector<Bad> bad = {
      {{{"quant_method", "gptq"}, {"bits", 4}}, "quant_method"},
      {{{"quant_method", "awq"}}, "\"awq\""},
      {{{"activation_scheme", "dynamic"}}, "quant_method"},
      {with(block, {{"fmt", "e5m2"}}), "fmt"},
      {with(block, {{"weight_block_size", {128, 96}}}), "weight_block_size"},
      {with(block, {{"weight_block_size", {128}}}), "weight_block_size"},
      {with(block, {{"activation_scheme", "per_token"}}), "activation_scheme"},
      {with(block, {{"kv_cache_quant", true}}), "kv_cache_quant"},
      {with(channel, {{"kv_cache_scheme", {{"num_bits", 8}}}}), "kv_cache_scheme"},
      {with(channel, {{"format", "pack-quantized"}}), "format"},
      {with(channel, {{"sparsity_config", {{"format", "sparse-24"}}}}), "sparsity_config"},
      {group({{"num_bits", 4}}), "group_0.weights.num_bits"},
      {group({{"type", "int"}}), "group_0.weights.type"},
      {group({{"strategy", "group"}, {"group_size", 128}}), "group_0.weights"},
      {group({{"strategy", "block"}}), "block_structure"},
      {group({{"symmetric", false}}), "symmetric"},
      {group({{"dynamic", true}}), "group_0.weights.dynamic"},
      {group({{"actorder", "group"}}), "actorder"},
      {group({{"zero_point", 1}}), "zero_point"},
      {with(channel, {{"config_groups", {{"group_0", {{"output_activations", {{"num_bits", 8}}}}}}}}), "output_activations"},
  };
  for (const Bad& b : bad) {
    INFO(b.qc.dump());
    CHECK_THROWS_WITH(parse_quantization_config(config_with(b.qc)),
                      Catch::Contains(b.names) && Catch::Contains("quantization_config"));
  }
}

TEST_CASE("FP8 tensors: missing, misshapen, broken and stray scales name the tensor", "[weights][fp8]") {
  using Tensors = std::map<std::string, ScratchModel::Tensor>;
  auto expect_error = [](const std::string& fixture, const std::function<void(ScratchModel&, Tensors&)>& edit,
                         const std::vector<std::string>& words) {
    ScratchModel m(fixture);
    Tensors t = m.tensors();
    edit(m, t);
    m.write_tensors(t);
    try {
      (void)m.load();
      FAIL("loaded without an error");
    } catch (const FormatError& e) {
      INFO(e.what());
      for (const std::string& w : words) CHECK(std::string(e.what()).find(w) != std::string::npos);
    }
  };
  const std::string q_scale = std::string(kQ0).substr(0, std::string(kQ0).size() - 6) + "weight_scale";
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel&, Tensors& t) { t.erase(q_scale); }, {kQ0, "no weight_scale"});
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel&, Tensors& t) { t[q_scale].shape = {3}; t[q_scale].bytes.resize(6); },
               {kQ0, "[3]"});
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel&, Tensors& t) { t[q_scale].bytes[1] = 0x80; }, {q_scale, "positive"});
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel&, Tensors& t) { t[kQ0].bytes[5] = 0x7f; }, {kQ0, "NaN"});
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel&, Tensors& t) {
    t["model.norm.weight_scale"] = {"F32", {1}, {0, 0, 128, 63}};
  }, {"model.norm.weight_scale", "no F8_E4M3 weight"});
  expect_error("tiny-llama-fp8-channel", [&](ScratchModel& m, Tensors&) {
    json c = m.config();
    c.erase("quantization_config");
    m.write_config(c);
  }, {"F8_E4M3 tensor", "quantization_config"});
  expect_error("tiny-qwen3-fp8-block", [&](ScratchModel&, Tensors& t) {
    const std::string inv = std::string(kQ0).substr(0, std::string(kQ0).size() - 6) + "weight_scale_inv";
    t[q_scale] = t[inv];
  }, {kQ0, "both"});
  expect_error("tiny-qwen3-fp8-block", [&](ScratchModel& m, Tensors&) {
    json c = m.config();
    c["quantization_config"]["weight_block_size"] = {64, 64};  // the stored grid is 128 x 128
    m.write_config(c);
  }, {"F8_E4M3 tensor", "64 x 64 block"});
  expect_error("tiny-qwen3-fp8-block", [&](ScratchModel&, Tensors& t) {
    t["model.layers.0.mlp.up_proj.weight"].dtype = "F8_E5M2";
  }, {"up_proj", "F8_E5M2"});
}
