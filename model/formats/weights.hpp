#pragma once
// Host-side model weights under their Hugging Face names, loaded from a safetensors directory or
// a GGUF file (renamed, and with llama.cpp's Q/K rotary row permutation undone), plus the check
// that they are exactly the tensors the config implies. A loaded tensor is not converted yet: it
// points into its mapped file (tensor_source.hpp) and is decoded rows at a time when the model
// uploads it, as bf16 or as FP8.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/format_error.hpp"
#include "model/formats/model_config.hpp"
#include "model/formats/tensor_source.hpp"

namespace fp8serve {

class GgufFile;
struct SafetensorsTensor;

struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;  // row-major, HF convention [out_features, in_features]
  std::vector<uint16_t> data;  // bf16 bits, when held in memory; empty when `source` is set
  std::shared_ptr<const TensorSource> source;  // the stored tensor, decoded on demand

  int64_t num_elements() const;
  // The [rows, cols] view: rows = shape[0], cols = the rest (1-D tensors: one row).
  int64_t rows() const;
  int64_t cols() const;
  // Rows [begin, end) in fp32 (out: (end - begin) * cols() floats).
  void read_rows(int64_t begin, int64_t end, float* out) const;
  // The whole tensor as bf16 (round to nearest even; exact for bf16 sources).
  std::vector<uint16_t> to_bf16() const;
  // An FP8 checkpoint weight's stored codes and scales; nullptr for every other tensor.
  const Fp8Weight* fp8() const { return source ? source->fp8() : nullptr; }
  std::string stored_type() const;
};

struct ModelWeights {
  std::map<std::string, HostTensor, std::less<>> tensors;  // by canonical (HF) name

  const HostTensor* find(std::string_view name) const;  // nullptr when absent
  const HostTensor& at(std::string_view name) const;    // FormatError naming it when absent
  uint64_t num_bytes() const;                           // as bf16
};

// One safetensors tensor (BF16 / F16 / F32) as bf16 in memory; FormatError naming it for other
// dtypes.
HostTensor host_tensor_from_safetensors(const SafetensorsTensor& tensor);
// Every tensor of a HF directory (BF16 / F16 / F32, and F8_E4M3 with the scales its
// quantization_config declares), validated.
ModelWeights load_hf_weights(const std::string& model_dir, const ModelConfig& config);
// Every tensor of a GGUF file, renamed, validated. The weights keep the file mapped.
ModelWeights load_gguf_weights(std::shared_ptr<const GgufFile> gguf, const ModelConfig& config);

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
