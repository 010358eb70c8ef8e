#include "model/formats/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/formats/gguf.hpp"

namespace fp8serve {
namespace {

using nlohmann::json;

// ---- config.json helpers: every accessor names the key it failed on. ----

std::optional<int64_t> opt_int(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    throw FormatError(std::string("config.json: '") + key + "' must be an integer, got " +
                      it->dump());
  }
  if (it->is_number_unsigned()) {
    const auto v = it->get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw FormatError(std::string("config.json: '") + key + "' is out of range: " + it->dump());
    }
    return static_cast<int64_t>(v);
  }
  return it->get<int64_t>();
}

int to_int(int64_t v, const std::string& key) {
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    throw FormatError("'" + key + "' is out of range: " + std::to_string(v));
  }
  return static_cast<int>(v);
}

int require_int(const json& j, const char* key) {
  const auto v = opt_int(j, key);
  if (!v) throw FormatError(std::string("config.json: required key '") + key + "' is missing");
  return to_int(*v, key);
}

int int_or(const json& j, const char* key, int fallback) {
  const auto v = opt_int(j, key);
  return v ? to_int(*v, key) : fallback;
}

std::optional<double> opt_number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    throw FormatError(std::string("config.json: '") + key + "' must be a number, got " +
                      it->dump());
  }
  return it->get<double>();
}

bool bool_or(const json& j, const char* key, bool fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    throw FormatError(std::string("config.json: '") + key + "' must be a bool, got " + it->dump());
  }
  return it->get<bool>();
}

std::optional<std::string> opt_string(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) {
    throw FormatError(std::string("config.json: '") + key + "' must be a string, got " +
                      it->dump());
  }
  return it->get<std::string>();
}

// eos_token_id may be an int, a list of ints or null.
std::optional<std::vector<int>> opt_token_ids(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  std::vector<int> ids;
  if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_number_integer()) {
        throw FormatError(std::string("'") + key + "' must hold integers, got " + it->dump());
      }
      ids.push_back(to_int(e.get<int64_t>(), key));
    }
  } else {
    const auto v = opt_int(j, key);
    ids.push_back(to_int(*v, key));
  }
  return ids;
}

Family family_from_hf(const json& config, std::string* architecture) {
  std::string arch;
  if (const auto it = config.find("architectures"); it != config.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      throw FormatError("config.json: 'architectures' must be a non-empty list of strings");
    }
    arch = (*it)[0].get<std::string>();
  } else if (const auto model_type = opt_string(config, "model_type")) {
    if (*model_type == "llama") arch = "LlamaForCausalLM";
    if (*model_type == "qwen2") arch = "Qwen2ForCausalLM";
    if (*model_type == "qwen3") arch = "Qwen3ForCausalLM";
    if (arch.empty()) {
      throw FormatError("config.json: model_type '" + *model_type +
                        "' is not supported (llama, qwen2, qwen3)");
    }
  } else {
    throw FormatError("config.json: neither 'architectures' nor 'model_type' is present");
  }
  *architecture = arch;
  if (arch == "LlamaForCausalLM") return Family::llama;
  if (arch == "Qwen2ForCausalLM") return Family::qwen2;
  if (arch == "Qwen3ForCausalLM") return Family::qwen3;
  throw FormatError("config.json: architecture '" + arch +
                    "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

// Rope: transformers 5 writes "rope_parameters" (with rope_theta inside), 4.x writes
// "rope_theta" and "rope_scaling" at the top level. Accept both.
void parse_hf_rope(const json& config, ModelConfig& c) {
  const json* rope = nullptr;
  const char* rope_key = "rope_parameters";
  if (const auto it = config.find("rope_parameters"); it != config.end() && !it->is_null()) {
    rope = &*it;
  } else if (const auto it2 = config.find("rope_scaling"); it2 != config.end() && !it2->is_null()) {
    rope = &*it2;
    rope_key = "rope_scaling";
  }
  double theta = opt_number(config, "rope_theta").value_or(10000.0);
  if (rope == nullptr) {
    c.rope_theta = static_cast<float>(theta);
    return;
  }
  if (!rope->is_object()) {
    throw FormatError(std::string("config.json: '") + rope_key + "' must be an object");
  }
  if (const auto t = opt_number(*rope, "rope_theta")) theta = *t;
  c.rope_theta = static_cast<float>(theta);
  std::string type = opt_string(*rope, "rope_type").value_or(opt_string(*rope, "type").value_or(""));
  if (type.empty()) {
    throw FormatError(std::string("config.json: '") + rope_key +
                      "' has no rope_type (per-layer-type rope parameters are not supported)");
  }
  if (type == "default") return;
  if (type != "llama3") {
    throw FormatError(std::string("config.json: ") + rope_key + " rope_type '" + type +
                      "' is not supported (default, llama3)");
  }
  auto need = [&](const char* key) {
    const auto v = opt_number(*rope, key);
    if (!v) {
      throw FormatError(std::string("config.json: llama3 ") + rope_key + " needs '" + key + "'");
    }
    return *v;
  };
  c.rope_scaling.kind = RopeScaling::Kind::llama3;
  c.rope_scaling.factor = static_cast<float>(need("factor"));
  c.rope_scaling.low_freq_factor = static_cast<float>(need("low_freq_factor"));
  c.rope_scaling.high_freq_factor = static_cast<float>(need("high_freq_factor"));
  const double orig = need("original_max_position_embeddings");
  if (!(orig >= 1 && orig <= 1e9) || orig != std::floor(orig)) {
    throw FormatError("config.json: original_max_position_embeddings must be a positive integer");
  }
  c.rope_scaling.original_max_position_embeddings = static_cast<int>(orig);
}

void reject_hf_unsupported(const json& config, const ModelConfig& c) {
  if (const auto act = opt_string(config, "hidden_act"); act && *act != "silu") {
    throw FormatError("config.json: hidden_act '" + *act + "' is not supported (silu)");
  }
  if (bool_or(config, "mlp_bias", false)) {
    throw FormatError("config.json: mlp_bias=true is not supported");
  }
  if (const auto f = opt_number(config, "partial_rotary_factor"); f && *f != 1.0) {
    throw FormatError("config.json: partial_rotary_factor " + std::to_string(*f) +
                      " is not supported (rope over the full head only)");
  }
  if (bool_or(config, "use_sliding_window", false)) {
    throw FormatError("config.json: use_sliding_window=true (sliding-window attention) is not "
                      "supported");
  }
  // Qwen configs carry sliding_window even when it is off; Llama has no such field, so a value
  // there means a model that expects windowed attention.
  if (c.family == Family::llama) {
    if (const auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
      throw FormatError("config.json: sliding_window=" + it->dump() + " is not supported");
    }
  }
  if (const auto it = config.find("layer_types"); it != config.end() && !it->is_null()) {
    if (!it->is_array()) throw FormatError("config.json: 'layer_types' must be a list");
    for (const auto& t : *it) {
      if (!t.is_string() || t.get<std::string>() != "full_attention") {
        throw FormatError("config.json: layer_types entry " + t.dump() +
                          " is not supported (full_attention only)");
      }
    }
  }
}

// llama.cpp's converter bakes llama3 rope scaling into a rope_freqs tensor of per-pair divisors
// of inv_freq and drops the parameters. They are recovered here by recomputing the divisors
// for the parameter sets Llama 3.x uses (factor = the largest divisor) and accepting only an
// exact reproduction (to f32 rounding); anything else is refused rather than guessed.
void recover_llama3_scaling(const GgufFile& gguf, const GgufTensorInfo& info, ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  if (info.type != GgmlType::f32 || info.num_elements() != half || half <= 0) {
    throw FormatError("GGUF: rope_freqs.weight must be F32 with head_dim / 2 = " +
                      std::to_string(half) + " elements");
  }
  std::vector<float> divisors(static_cast<size_t>(half));
  std::memcpy(divisors.data(), gguf.tensor_data(info).data(), divisors.size() * sizeof(float));
  const float factor = *std::max_element(divisors.begin(), divisors.end());
  if (!(factor >= 1.0f) || !std::isfinite(factor)) {
    throw FormatError("GGUF: rope_freqs.weight holds invalid divisors");
  }
  if (factor == 1.0f) return;  // no scaling at all
  // The converter's arithmetic: inv_freq in f32 (as torch computes it), the rest in double.
  auto divisors_for = [&](double low, double high, double orig) {
    std::vector<float> out(divisors.size());
    for (int64_t i = 0; i < half; ++i) {
      const auto exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
      const auto power = static_cast<float>(std::pow(static_cast<double>(c.rope_theta), exponent));
      const double freq = 1.0f / power;
      const double wavelen = 2 * std::numbers::pi / freq;
      double d = factor;
      if (wavelen < orig / high) {
        d = 1.0;
      } else if (wavelen <= orig / low) {
        const double smooth = (orig / wavelen - low) / (high - low);
        d = 1.0 / ((1.0 - smooth) / factor + smooth);
      }
      out[static_cast<size_t>(i)] = static_cast<float>(d);
    }
    return out;
  };
  auto matches = [&](const std::vector<float>& want) {
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::fabs(want[i] - divisors[i]) > 1e-6f * divisors[i]) return false;
    }
    return true;
  };
  for (const double orig : {8192.0, 4096.0, 16384.0, 2048.0, 32768.0}) {
    for (const auto& [low, high] : {std::pair{1.0, 4.0}, {1.0, 2.0}, {1.0, 8.0}, {0.5, 4.0}}) {
      if (matches(divisors_for(low, high, orig))) {
        c.rope_scaling.kind = RopeScaling::Kind::llama3;
        c.rope_scaling.factor = factor;
        c.rope_scaling.low_freq_factor = static_cast<float>(low);
        c.rope_scaling.high_freq_factor = static_cast<float>(high);
        c.rope_scaling.original_max_position_embeddings = static_cast<int>(orig);
        return;
      }
    }
  }
  throw FormatError("GGUF: rope_freqs.weight does not match llama3 rope scaling with the "
                    "parameters Llama 3.x uses; this rope scaling is not supported");
}

}  // namespace

std::string_view family_name(Family family) {
  switch (family) {
    case Family::llama: return "llama";
    case Family::qwen2: return "qwen2";
    case Family::qwen3: return "qwen3";
  }
  return "?";
}

ModelConfig parse_hf_config(const json& config, const json* generation_config) {
  if (!config.is_object()) throw FormatError("config.json: top level must be an object");
  ModelConfig c;
  c.family = family_from_hf(config, &c.architecture);
  const bool is_qwen = c.family != Family::llama;
  c.hidden_size = require_int(config, "hidden_size");
  c.intermediate_size = require_int(config, "intermediate_size");
  c.num_layers = require_int(config, "num_hidden_layers");
  c.num_heads = require_int(config, "num_attention_heads");
  c.vocab_size = require_int(config, "vocab_size");
  // HF Llama falls back to num_attention_heads; the Qwen classes fall back to an arbitrary 32,
  // which we refuse to guess.
  c.num_kv_heads = is_qwen ? require_int(config, "num_key_value_heads")
                           : int_or(config, "num_key_value_heads", c.num_heads);
  if (c.num_heads <= 0) throw FormatError("config.json: num_attention_heads must be positive");
  // Defaults as in the transformers config classes (Qwen3Config: head_dim 128).
  const int derived_head_dim = c.hidden_size / c.num_heads;
  c.head_dim = int_or(config, "head_dim", c.family == Family::qwen3 ? 128 : derived_head_dim);
  if (c.family == Family::qwen2 && c.head_dim != derived_head_dim) {
    throw FormatError("config.json: Qwen2 head_dim " + std::to_string(c.head_dim) +
                      " differs from hidden_size / num_attention_heads");
  }
  c.max_position_embeddings = int_or(config, "max_position_embeddings", is_qwen ? 32768 : 2048);
  c.rms_norm_eps = static_cast<float>(opt_number(config, "rms_norm_eps").value_or(1e-6));
  c.tie_word_embeddings = bool_or(config, "tie_word_embeddings", false);
  parse_hf_rope(config, c);
  reject_hf_unsupported(config, c);
  if (c.family == Family::qwen2) {
    c.attention_bias = true;
  } else if (bool_or(config, "attention_bias", false)) {
    // Llama's and Qwen3's attention_bias also puts a bias on o_proj, which we do not implement.
    throw FormatError("config.json: attention_bias=true is not supported for " +
                      std::string(family_name(c.family)) + " (o_proj bias)");
  }
  c.qk_norm = c.family == Family::qwen3;
  c.quantization = parse_quantization_config(config);

  c.bos_token_id = int_or(config, "bos_token_id", -1);
  c.eos_token_ids = opt_token_ids(config, "eos_token_id").value_or(std::vector<int>{});
  if (generation_config != nullptr && !generation_config->is_null()) {
    if (!generation_config->is_object()) {
      throw FormatError("generation_config.json: top level must be an object");
    }
    if (const auto bos = opt_int(*generation_config, "bos_token_id")) {
      c.bos_token_id = to_int(*bos, "bos_token_id");
    }
    if (auto eos = opt_token_ids(*generation_config, "eos_token_id")) c.eos_token_ids = *eos;
  }
  validate_config(c);
  return c;
}

ModelConfig load_hf_config(const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  auto read_json = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw FormatError(path.string() + ": cannot open");
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw FormatError(path.string() + ": invalid JSON");
    return j;
  };
  const json config = read_json(dir / "config.json");
  std::optional<json> generation;
  if (std::filesystem::exists(dir / "generation_config.json")) {
    generation = read_json(dir / "generation_config.json");
  }
  try {
    return parse_hf_config(config, generation ? &*generation : nullptr);
  } catch (const FormatError& e) {
    throw FormatError(model_dir + ": " + e.what());
  }
}

ModelConfig parse_gguf_config(const GgufFile& gguf) {
  const auto arch = gguf.get_string("general.architecture");
  if (!arch) throw FormatError("GGUF: required key 'general.architecture' is missing");
  ModelConfig c;
  if (*arch == "llama") {
    c.family = Family::llama;
    c.architecture = "LlamaForCausalLM";
  } else if (*arch == "qwen2") {
    c.family = Family::qwen2;
    c.architecture = "Qwen2ForCausalLM";
  } else if (*arch == "qwen3") {
    c.family = Family::qwen3;
    c.architecture = "Qwen3ForCausalLM";
  } else {
    throw FormatError("GGUF: general.architecture '" + *arch +
                      "' is not supported (llama, qwen2, qwen3)");
  }
  const std::string p = *arch + ".";
  auto require = [&](const std::string& key) {
    const auto v = gguf.get_int(p + key);
    if (!v) throw FormatError("GGUF: required key '" + p + key + "' is missing");
    return to_int(*v, p + key);
  };
  auto int_or_key = [&](const std::string& key, int fallback) {
    const auto v = gguf.get_int(p + key);
    return v ? to_int(*v, p + key) : fallback;
  };
  c.hidden_size = require("embedding_length");
  c.intermediate_size = require("feed_forward_length");
  c.num_layers = require("block_count");
  c.num_heads = require("attention.head_count");
  c.num_kv_heads = int_or_key("attention.head_count_kv", c.num_heads);
  c.max_position_embeddings = require("context_length");
  if (c.num_heads <= 0) throw FormatError("GGUF: " + p + "attention.head_count must be positive");
  c.head_dim = int_or_key("attention.key_length", c.hidden_size / c.num_heads);
  if (const auto v = gguf.get_int(p + "attention.value_length"); v && *v != c.head_dim) {
    throw FormatError("GGUF: " + p + "attention.value_length " + std::to_string(*v) +
                      " differs from the key length (not supported)");
  }
  if (const auto v = gguf.get_int(p + "rope.dimension_count"); v && *v != c.head_dim) {
    throw FormatError("GGUF: " + p + "rope.dimension_count " + std::to_string(*v) +
                      " is not the head dim " + std::to_string(c.head_dim) +
                      " (partial rotary is not supported)");
  }
  c.rope_theta = static_cast<float>(gguf.get_float(p + "rope.freq_base").value_or(10000.0));
  const auto eps = gguf.get_float(p + "attention.layer_norm_rms_epsilon");
  if (!eps) throw FormatError("GGUF: required key '" + p + "attention.layer_norm_rms_epsilon' is missing");
  c.rms_norm_eps = static_cast<float>(*eps);
  if (const auto type = gguf.get_string(p + "rope.scaling.type"); type && *type != "none") {
    throw FormatError("GGUF: " + p + "rope.scaling.type '" + *type + "' is not supported");
  }
  if (const GgufTensorInfo* freqs = gguf.find_tensor("rope_freqs.weight")) {
    recover_llama3_scaling(gguf, *freqs, c);
  }
  if (gguf.has(p + "attention.sliding_window")) {
    throw FormatError("GGUF: " + p + "attention.sliding_window is set (sliding-window attention "
                      "is not supported)");
  }
  if (const auto v = gguf.get_int(p + "vocab_size")) {
    c.vocab_size = to_int(*v, p + "vocab_size");
  } else if (const GgufTensorInfo* embd = gguf.find_tensor("token_embd.weight");
             embd != nullptr && embd->shape.size() == 2) {
    c.vocab_size = to_int(embd->shape[1], "token_embd.weight shape");
  } else {
    c.vocab_size = to_int(static_cast<int64_t>(gguf.get_string_array("tokenizer.ggml.tokens").size()),
                          "tokenizer.ggml.tokens");
  }
  c.tie_word_embeddings = gguf.find_tensor("output.weight") == nullptr;
  c.attention_bias = c.family == Family::qwen2;
  c.qk_norm = c.family == Family::qwen3;
  if (const auto bos = gguf.get_int("tokenizer.ggml.bos_token_id")) {
    c.bos_token_id = to_int(*bos, "tokenizer.ggml.bos_token_id");
  }
  if (const auto eos = gguf.get_int("tokenizer.ggml.eos_token_id")) {
    c.eos_token_ids.push_back(to_int(*eos, "tokenizer.ggml.eos_token_id"));
  }
  // An end-of-turn token distinct from eos also ends generation (as llama.cpp does).
  if (const auto eot = gguf.get_int("tokenizer.ggml.eot_token_id")) {
    const int id = to_int(*eot, "tokenizer.ggml.eot_token_id");
    if (c.eos_token_ids.empty() || c.eos_token_ids[0] != id) c.eos_token_ids.push_back(id);
  }
  validate_config(c);
  return c;
}

void validate_config(const ModelConfig& c) {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw FormatError("model config: " + what);
  };
  auto in_range = [&](int v, int lo, int hi, const char* name) {
    check(v >= lo && v <= hi, std::string(name) + " = " + std::to_string(v) + " is outside [" +
                                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  // Generous caps (several times the largest public models) that keep every product of them
  // well inside 64-bit arithmetic.
  in_range(c.hidden_size, 1, 1 << 16, "hidden_size");
  in_range(c.intermediate_size, 1, 1 << 18, "intermediate_size");
  in_range(c.num_layers, 1, 1024, "num_layers");
  in_range(c.num_heads, 1, 1024, "num_heads");
  in_range(c.num_kv_heads, 1, c.num_heads, "num_kv_heads");
  in_range(c.head_dim, 2, 1024, "head_dim");
  in_range(c.vocab_size, 1, 1 << 20, "vocab_size");  // the sampler's exact sums hold 2^20 terms (ExpSum)
  in_range(c.max_position_embeddings, 1, 1 << 30, "max_position_embeddings");
  check(c.num_heads % c.num_kv_heads == 0,
        "num_heads " + std::to_string(c.num_heads) + " is not a multiple of num_kv_heads " +
            std::to_string(c.num_kv_heads));
  check(c.head_dim % 2 == 0, "head_dim " + std::to_string(c.head_dim) + " must be even (rope)");
  check(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f, "rope_theta must be finite and > 1");
  check(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0.0f && c.rms_norm_eps < 1.0f,
        "rms_norm_eps must be in (0, 1)");
  if (c.rope_scaling.kind == RopeScaling::Kind::llama3) {
    const RopeScaling& r = c.rope_scaling;
    check(std::isfinite(r.factor) && r.factor >= 1.0f, "rope_scaling factor must be >= 1");
    check(std::isfinite(r.low_freq_factor) && std::isfinite(r.high_freq_factor) &&
              r.low_freq_factor > 0.0f && r.high_freq_factor > r.low_freq_factor,
          "rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    check(r.original_max_position_embeddings > 0,
          "rope_scaling original_max_position_embeddings must be positive");
  }
  check(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size,
        "bos_token_id " + std::to_string(c.bos_token_id) + " is outside the vocabulary");
  for (int id : c.eos_token_ids) {
    check(id >= 0 && id < c.vocab_size,
          "eos_token_id " + std::to_string(id) + " is outside the vocabulary");
  }
}

uint64_t num_parameters(const ModelConfig& c) {
  const uint64_t h = c.hidden_size, hd = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads;
  const uint64_t v = c.vocab_size, ffn = c.intermediate_size;
  uint64_t layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h  // q, k, v, o
                   + 3 * h * ffn                                 // gate, up, down
                   + 2 * h;                                      // the two RMSNorms
  if (c.attention_bias) layer += (nh + 2 * nkv) * hd;
  if (c.qk_norm) layer += 2 * hd;
  uint64_t total = v * h + static_cast<uint64_t>(c.num_layers) * layer + h;
  if (!c.tie_word_embeddings) total += v * h;
  return total;
}

}  // namespace fp8serve
