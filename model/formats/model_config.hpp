#pragma once
// The architecture facts of a model, read from a Hugging Face config.json (+ generation_config
// .json) or from GGUF metadata. Llama, Qwen2 and Qwen3 differ only by the flags here; anything
// we do not implement (another architecture, a rope type, a sliding window, partial rotary)
// throws FormatError naming the key, so a model is never run silently wrong.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/formats/format_error.hpp"

namespace fp8serve {

class GgufFile;

enum class Family { llama, qwen2, qwen3 };

std::string_view family_name(Family family);  // "llama", "qwen2", "qwen3"

struct RopeScaling {
  enum class Kind { none, llama3 };
  Kind kind = Kind::none;
  // llama3 only (HF rope_type "llama3"): frequencies below original_max_position_embeddings /
  // low_freq_factor wavelengths are divided by factor, those above .../high_freq_factor kept,
  // and the band between interpolated smoothly.
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 0;
};

// The weight quantization a checkpoint declares (config.json's quantization_config). Only FP8
// E4M3 weights are understood, as published:
//   quant_method "fp8" (vLLM, Qwen3-FP8):  weight_scale per tensor, or with weight_block_size
//       [rows, cols] a weight_scale_inv per block (the multiplier: w = q * weight_scale_inv)
//   quant_method "compressed-tensors" (llm-compressor), float 8-bit weights, strategy tensor,
//       channel or block: weight_scale per tensor, per channel or per block
// input_scale (static activation scales) may be present and is unused: activations stay bf16 /
// fp32. Anything else is a FormatError naming the key (quantization_config.cpp).
struct WeightQuantization {
  bool fp8 = false;
  std::string method;  // quant_method as written
  // Block scales: rows x cols weights per scale (0 x 0: per tensor or per channel).
  int block_rows = 0;
  int block_cols = 0;
};

// Parses config.json's quantization_config (absent or null: no quantization).
WeightQuantization parse_quantization_config(const nlohmann::json& config);

struct ModelConfig {
  Family family = Family::llama;
  std::string architecture;  // the HF class name: LlamaForCausalLM, Qwen2ForCausalLM, ...
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // independent of hidden_size / num_heads for Qwen3
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v projections (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm on q and k before rope (Qwen3)
  WeightQuantization quantization;  // HF checkpoints; GGUF files: none
  int bos_token_id = -1;        // -1: none
  std::vector<int> eos_token_ids;
};

// generation_config may be null. Its bos/eos ids win over config.json's, as in HF generate().
ModelConfig parse_hf_config(const nlohmann::json& config, const nlohmann::json* generation_config);
// Reads config.json and, when present, generation_config.json from a model directory.
ModelConfig load_hf_config(const std::string& model_dir);
// The same facts from GGUF metadata (general.architecture, <arch>.* and tokenizer.ggml.* keys);
// tie_word_embeddings is true when the file has no output.weight tensor.
ModelConfig parse_gguf_config(const GgufFile& gguf);

// Checks ranges and consistency (GQA divisibility, even head_dim, ...); both parsers call it.
void validate_config(const ModelConfig& config);

// Number of weights (embeddings, all layers, final norm, lm_head unless tied).
uint64_t num_parameters(const ModelConfig& config);

}  // namespace fp8serve
