// config.json's quantization_config: the FP8 checkpoint formats fp8serve reads (model_config.hpp,
// WeightQuantization), and a FormatError naming the key for everything else, so a checkpoint we
// do not understand is never run with its weights misread.
#include <nlohmann/json.hpp>

#include <set>
#include <string>

#include "model/formats/model_config.hpp"

namespace fp8serve {
namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FormatError("config.json: " + path + " " + what +
                    " (fp8serve reads FP8 E4M3 weight checkpoints: quant_method \"fp8\", or "
                    "\"compressed-tensors\" with 8-bit float weights per tensor, channel or block)");
}

// Every key of `object` must be in `known`.
void only_keys(const json& object, const std::string& path, const std::set<std::string>& known) {
  if (!object.is_object()) fail(path, "must be an object, got " + object.dump());
  for (const auto& [key, value] : object.items()) {
    if (known.count(key) == 0) fail(path + "." + key, "is not supported");
  }
}

bool present(const json& object, const char* key) {
  return object.contains(key) && !object[key].is_null();
}

void expect_value(const json& object, const std::string& path, const char* key, const json& value) {
  if (present(object, key) && object[key] != value) {
    fail(path + "." + key, "= " + object[key].dump() + " is not supported (expected " + value.dump() + ")");
  }
}

void expect_null(const json& object, const std::string& path, const char* key) {
  if (present(object, key)) fail(path + "." + key, "= " + object[key].dump() + " is not supported");
}

void expect_string_list(const json& object, const std::string& path, const char* key) {
  if (!present(object, key)) return;
  const json& list = object[key];
  if (!list.is_array()) fail(path + "." + key, "must be a list of names");
  for (const json& item : list) {
    if (!item.is_string()) fail(path + "." + key, "must be a list of names, got " + item.dump());
  }
}

// [rows, cols] of a block-scale layout; cols must be whole 64-input chunks (the CPU kernels').
void block_size(const json& value, const std::string& path, WeightQuantization& q) {
  if (!value.is_array() || value.size() != 2 || !value[0].is_number_integer() ||
      !value[1].is_number_integer() || value[0].get<int64_t>() < 1 || value[1].get<int64_t>() < 1 ||
      value[0].get<int64_t>() > 65536 || value[1].get<int64_t>() > 65536) {
    fail(path, "must be [rows, cols] of positive integers, got " + value.dump());
  }
  const int rows = value[0].get<int>(), cols = value[1].get<int>();
  if (cols % 64 != 0) fail(path, "= " + value.dump() + ": block columns must be a multiple of 64");
  if (q.block_rows != 0 && (q.block_rows != rows || q.block_cols != cols)) {
    fail(path, "= " + value.dump() + " differs from another group's block size");
  }
  q.block_rows = rows;
  q.block_cols = cols;
}

// quant_method "fp8": vLLM's Fp8Config and transformers' FineGrainedFP8Config.
void parse_fp8(const json& qc, WeightQuantization& q) {
  const std::string path = "quantization_config";
  only_keys(qc, path, {"quant_method", "activation_scheme", "fmt", "weight_block_size", "ignored_layers",
                       "modules_to_not_convert"});
  if (present(qc, "activation_scheme") && qc["activation_scheme"] != "dynamic" && qc["activation_scheme"] != "static") {
    fail(path + ".activation_scheme", "= " + qc["activation_scheme"].dump() + " is not supported");
  }
  expect_value(qc, path, "fmt", "e4m3");
  expect_string_list(qc, path, "ignored_layers");
  expect_string_list(qc, path, "modules_to_not_convert");
  if (present(qc, "weight_block_size")) block_size(qc["weight_block_size"], path + ".weight_block_size", q);
}

// The quantization args of one tensor kind in a compressed-tensors group.
void parse_args(const json& args, const std::string& path, bool weights, WeightQuantization& q) {
  only_keys(args, path, {"num_bits", "type", "strategy", "symmetric", "dynamic", "group_size", "block_structure",
                         "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"});
  if (!present(args, "num_bits") || args["num_bits"] != 8) fail(path + ".num_bits", "must be 8");
  if (!present(args, "type") || args["type"] != "float") fail(path + ".type", "must be \"float\" (E4M3)");
  expect_value(args, path, "symmetric", true);
  expect_null(args, path, "group_size");
  expect_null(args, path, "actorder");
  expect_null(args, path, "scale_dtype");
  expect_null(args, path, "zp_dtype");
  const std::string strategy = present(args, "strategy") && args["strategy"].is_string() ? args["strategy"].get<std::string>() : "";
  if (!weights) {
    // Activation quantization (dynamic per token, or static input_scale): unused, activations
    // stay bf16 / fp32, so only its shape is checked.
    if (strategy != "token" && strategy != "tensor") fail(path + ".strategy", "= " + args.value("strategy", json()).dump() + " is not supported");
    expect_null(args, path, "block_structure");
    return;
  }
  expect_value(args, path, "dynamic", false);
  if (strategy == "block") {
    if (!present(args, "block_structure")) fail(path + ".block_structure", "is required for strategy \"block\"");
    block_size(args["block_structure"], path + ".block_structure", q);
  } else if (strategy == "tensor" || strategy == "channel") {
    expect_null(args, path, "block_structure");
  } else {
    fail(path + ".strategy", "= " + args.value("strategy", json()).dump() + " is not supported");
  }
}

// quant_method "compressed-tensors" (llm-compressor's FP8 W8A8 / W8A16 checkpoints).
void parse_compressed_tensors(const json& qc, WeightQuantization& q) {
  const std::string path = "quantization_config";
  only_keys(qc, path, {"quant_method", "config_groups", "format", "ignore", "quantization_status",
                       "global_compression_ratio", "kv_cache_scheme", "sparsity_config", "transform_config",
                       "version"});
  auto check_format = [](const json& object, const std::string& at) {
    if (present(object, "format") && object["format"] != "float-quantized" && object["format"] != "naive-quantized") {
      fail(at + ".format", "= " + object["format"].dump() + " is not supported");
    }
  };
  check_format(qc, path);
  expect_string_list(qc, path, "ignore");
  expect_null(qc, path, "kv_cache_scheme");
  expect_null(qc, path, "transform_config");
  if (present(qc, "sparsity_config") && !qc["sparsity_config"].empty()) {
    fail(path + ".sparsity_config", "is not supported");
  }
  if (!present(qc, "config_groups") || !qc["config_groups"].is_object() || qc["config_groups"].empty()) {
    fail(path + ".config_groups", "must be a non-empty object");
  }
  for (const auto& [name, group] : qc["config_groups"].items()) {
    const std::string at = path + ".config_groups." + name;
    only_keys(group, at, {"targets", "weights", "input_activations", "output_activations", "format"});
    check_format(group, at);
    expect_string_list(group, at, "targets");
    expect_null(group, at, "output_activations");
    if (!present(group, "weights")) fail(at + ".weights", "is required");
    parse_args(group["weights"], at + ".weights", true, q);
    if (present(group, "input_activations")) parse_args(group["input_activations"], at + ".input_activations", false, q);
  }
}

}  // namespace

WeightQuantization parse_quantization_config(const json& config) {
  WeightQuantization q;
  const auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return q;
  const json& qc = *it;
  if (!qc.is_object()) fail("quantization_config", "must be an object");
  if (!present(qc, "quant_method") || !qc["quant_method"].is_string()) {
    fail("quantization_config.quant_method", "is missing");
  }
  q.method = qc["quant_method"].get<std::string>();
  if (q.method == "fp8") {
    parse_fp8(qc, q);
  } else if (q.method == "compressed-tensors") {
    parse_compressed_tensors(qc, q);
  } else {
    fail("quantization_config.quant_method", "= \"" + q.method + "\" is not supported");
  }
  q.fp8 = true;
  return q;
}

}  // namespace fp8serve
