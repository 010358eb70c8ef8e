#pragma once
// Host-side model weights in bf16 under their Hugging Face names, loaded from a safetensors
// directory or a GGUF file (dequantized, renamed, and with llama.cpp's Q/K rotary row
// permutation undone), plus the check that they are exactly the tensors the config implies.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/format_error.hpp"
#include "model/formats/model_config.hpp"

namespace fp8serve {

class GgufFile;
struct SafetensorsTensor;

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major, HF convention [out_features, in_features]
  std::vector<uint16_t> data;  // bf16 bits
  int64_t num_elements() const;
};

struct ModelWeights {
  std::map<std::string, HostTensor, std::less<>> tensors;  // by canonical (HF) name

  const HostTensor* find(std::string_view name) const;  // nullptr when absent
  const HostTensor& at(std::string_view name) const;    // FormatError naming it when absent
  uint64_t num_bytes() const;                           // of the bf16 data
};

// One safetensors tensor (BF16 / F16 / F32) as bf16; FormatError naming it for other dtypes.
HostTensor host_tensor_from_safetensors(const SafetensorsTensor& tensor);
// Loads every tensor of a HF directory (BF16 / F16 / F32, converted to bf16) and validates them.
ModelWeights load_hf_weights(const std::string& model_dir, const ModelConfig& config);
// Loads, dequantizes and renames every tensor of a GGUF file, then validates them.
ModelWeights load_gguf_weights(const GgufFile& gguf, const ModelConfig& config);

// HF name of a GGUF tensor ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight");
// empty when the name is not one we know.
std::string hf_name_from_gguf(std::string_view gguf_name);

// The tensors a config implies, with their shapes. lm_head.weight is listed only when the
// embeddings are not tied.
std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const ModelConfig& config);

struct WeightProblems {
  std::vector<std::string> missing;
  std::vector<std::string> extra;
  std::vector<std::string> misshapen;  // "name: got [a, b], expected [c, d]"
  bool ok() const { return missing.empty() && extra.empty() && misshapen.empty(); }
  std::string message() const;
};

WeightProblems check_weights(const ModelWeights& weights, const ModelConfig& config);
// Throws FormatError listing every missing, extra and misshapen tensor by name. A tied model may
// carry lm_head.weight only if it equals the embeddings bit for bit (some exporters write both).
void validate_weights(const ModelWeights& weights, const ModelConfig& config);

}  // namespace fp8serve
