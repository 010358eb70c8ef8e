#include "model/formats/weights.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "model/formats/dequant.hpp"
#include "model/formats/fp8_checkpoint.hpp"
#include "model/formats/gguf.hpp"
#include "model/formats/safetensors.hpp"

namespace fp8serve {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

HostTensor host_tensor_from_safetensors(const SafetensorsTensor& t) {
  HostTensor out;
  out.name = t.name;
  out.shape = t.shape;
  const auto n = static_cast<size_t>(t.num_elements());
  out.data.resize(n);
  const uint8_t* src = t.data.data();
  switch (t.dtype) {
    case SafetensorsDtype::bf16:
      if (n > 0) std::memcpy(out.data.data(), src, n * 2);
      break;
    case SafetensorsDtype::f16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out.data[i] = f32_to_bf16(f16_to_f32(h));
      }
      break;
    case SafetensorsDtype::f32:
      for (size_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        out.data[i] = f32_to_bf16(f);
      }
      break;
    default:
      throw FormatError("safetensors: tensor '" + t.name + "' has dtype " +
                        std::string(safetensors_dtype_name(t.dtype)) +
                        " (supported: BF16, F16, F32)");
  }
  return out;
}


int64_t HostTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t HostTensor::rows() const { return shape.size() >= 2 ? shape[0] : 1; }

int64_t HostTensor::cols() const {
  const int64_t r = rows();
  return r > 0 ? num_elements() / r : 0;
}

void HostTensor::read_rows(int64_t begin, int64_t end, float* out) const {
  if (source) {
    source->read_rows(begin, end, out);
    return;
  }
  const int64_t c = cols();
  for (int64_t i = begin * c; i < end * c; ++i) out[i - begin * c] = bf16_to_f32(data[static_cast<size_t>(i)]);
}

std::vector<uint16_t> HostTensor::to_bf16() const {
  if (!source) return data;
  std::vector<uint16_t> out(static_cast<size_t>(num_elements()));
  const int64_t c = cols(), chunk = std::max<int64_t>(1, 65536 / std::max<int64_t>(c, 1));
  std::vector<float> rows_f32(static_cast<size_t>(chunk * c));
  for (int64_t r = 0; r < rows(); r += chunk) {
    const int64_t end = std::min(rows(), r + chunk);
    read_rows(r, end, rows_f32.data());
    for (int64_t i = 0; i < (end - r) * c; ++i) out[static_cast<size_t>(r * c + i)] = f32_to_bf16(rows_f32[static_cast<size_t>(i)]);
  }
  return out;
}

std::string HostTensor::stored_type() const { return source ? std::string(source->stored_type()) : "BF16"; }

const HostTensor* ModelWeights::find(std::string_view name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const HostTensor& ModelWeights::at(std::string_view name) const {
  const HostTensor* t = find(name);
  if (t == nullptr) throw FormatError("weights: tensor '" + std::string(name) + "' is missing");
  return *t;
}

uint64_t ModelWeights::num_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += static_cast<uint64_t>(t.num_elements()) * sizeof(uint16_t);
  return total;
}

std::string hf_name_from_gguf(std::string_view name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.substr(0, 4) != "blk.") return {};
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos || dot == 4 || dot - 4 > 4) return {};
  const std::string_view layer = name.substr(4, dot - 4);
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      (layer.size() > 1 && layer[0] == '0')) {
    return {};
  }
  const std::string_view rest = name.substr(dot + 1);
  static constexpr std::pair<std::string_view, std::string_view> kMap[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  for (const auto& [gguf, hf] : kMap) {
    if (rest == gguf) return "model.layers." + std::string(layer) + "." + std::string(hf);
  }
  return {};
}

ModelWeights load_hf_weights(const std::string& model_dir, const ModelConfig& config) {
  const auto model = std::make_shared<const SafetensorsModel>(SafetensorsModel::open_dir(model_dir));
  ModelWeights weights;
  for (const SafetensorsTensor* t : model->tensors()) {
    // Old Llama checkpoints store the rotary inverse frequencies; they are derived, not weights.
    if (ends_with(t->name, ".rotary_emb.inv_freq")) continue;
    // FP8 scales belong to their weight (fp8_checkpoint_weight checks that each has one).
    if (is_fp8_scale_name(t->name)) continue;
    HostTensor h;
    h.name = t->name;
    h.shape = t->shape;
    Fp8Weight fp8;
    if (t->dtype == SafetensorsDtype::f8_e4m3) fp8 = fp8_checkpoint_weight(*model, *t, config.quantization);
    h.source = safetensors_tensor_source(model, *t, std::max<int64_t>(h.rows(), 1), std::max<int64_t>(h.cols(), 1),
                                         std::move(fp8));
    weights.tensors.emplace(t->name, std::move(h));
  }
  check_fp8_scales_have_weights(*model);
  validate_weights(weights, config);
  return weights;
}

ModelWeights load_gguf_weights(std::shared_ptr<const GgufFile> gguf, const ModelConfig& config) {
  ModelWeights weights;
  for (const GgufTensorInfo& info : gguf->tensors()) {
    // Rope scaling divisors: parse_gguf_config has turned them into config.rope_scaling.
    if (info.name == "rope_freqs.weight") continue;
    std::string name = hf_name_from_gguf(info.name);
    if (name.empty()) name = info.name;  // kept so validation reports it as extra, by name
    HostTensor t;
    t.name = name;
    t.shape.assign(info.shape.rbegin(), info.shape.rend());  // ggml ne is innermost-first
    if (!can_dequantize(info.type)) {
      throw FormatError("GGUF: tensor '" + info.name + "': type " + std::string(ggml_type_name(info.type)) +
                        " cannot be dequantized (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                        "Q4_K, Q5_K, Q6_K)");
    }
    int unpermute_heads = 0;
    if (config.family == Family::llama && t.shape.size() >= 1 &&
        (ends_with(name, "self_attn.q_proj.weight") || ends_with(name, "self_attn.k_proj.weight"))) {
      unpermute_heads = ends_with(name, "q_proj.weight") ? config.num_heads : config.num_kv_heads;
      if (unpermute_heads <= 0) throw FormatError("GGUF: tensor '" + info.name + "': the config has no heads");
    }
    const int64_t rows = t.shape.size() >= 2 ? t.shape[0] : 1;
    const int64_t cols = rows > 0 ? info.num_elements() / rows : 0;
    if (rows < 1 || cols < 1) throw FormatError("GGUF: tensor '" + info.name + "' is empty");
    t.source = gguf_tensor_source(gguf, info, rows, cols, unpermute_heads);
    if (!weights.tensors.emplace(name, std::move(t)).second) {
      throw FormatError("GGUF: two tensors map to '" + name + "'");
    }
  }
  validate_weights(weights, config);
  return weights;
}

std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, hd = c.head_dim, q = int64_t{c.num_heads} * hd,
                kv = int64_t{c.num_kv_heads} * hd, ffn = c.intermediate_size, v = c.vocab_size;
  std::map<std::string, std::vector<int64_t>> shapes;
  shapes["model.embed_tokens.weight"] = {v, h};
  shapes["model.norm.weight"] = {h};
  if (!c.tie_word_embeddings) shapes["lm_head.weight"] = {v, h};
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shapes[p + "input_layernorm.weight"] = {h};
    shapes[p + "post_attention_layernorm.weight"] = {h};
    shapes[p + "self_attn.q_proj.weight"] = {q, h};
    shapes[p + "self_attn.k_proj.weight"] = {kv, h};
    shapes[p + "self_attn.v_proj.weight"] = {kv, h};
    shapes[p + "self_attn.o_proj.weight"] = {h, q};
    if (c.attention_bias) {
      shapes[p + "self_attn.q_proj.bias"] = {q};
      shapes[p + "self_attn.k_proj.bias"] = {kv};
      shapes[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.qk_norm) {
      shapes[p + "self_attn.q_norm.weight"] = {hd};
      shapes[p + "self_attn.k_norm.weight"] = {hd};
    }
    shapes[p + "mlp.gate_proj.weight"] = {ffn, h};
    shapes[p + "mlp.up_proj.weight"] = {ffn, h};
    shapes[p + "mlp.down_proj.weight"] = {h, ffn};
  }
  return shapes;
}

std::string WeightProblems::message() const {
  std::ostringstream os;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    os << (os.tellp() > 0 ? "; " : "") << what << " (" << names.size() << "): ";
    for (size_t i = 0; i < names.size(); ++i) {
      if (i == 20) {
        os << ", ... " << names.size() - 20 << " more";
        break;
      }
      os << (i ? ", " : "") << names[i];
    }
  };
  list("missing", missing);
  list("extra", extra);
  list("misshapen", misshapen);
  return os.str();
}

WeightProblems check_weights(const ModelWeights& weights, const ModelConfig& config) {
  const auto expected = expected_weight_shapes(config);
  WeightProblems problems;
  for (const auto& [name, shape] : expected) {
    const HostTensor* t = weights.find(name);
    if (t == nullptr) {
      problems.missing.push_back(name);
    } else if (t->shape != shape) {
      problems.misshapen.push_back(name + ": got " + shape_str(t->shape) + ", expected " +
                                   shape_str(shape));
    } else if (!t->source && t->data.size() != static_cast<size_t>(t->num_elements())) {
      problems.misshapen.push_back(name + ": holds " + std::to_string(t->data.size()) +
                                   " values for shape " + shape_str(shape));
    }
  }
  for (const auto& [name, t] : weights.tensors) {
    if (expected.count(name) != 0) continue;
    if (name == "lm_head.weight" && config.tie_word_embeddings) {
      const HostTensor* embed = weights.find("model.embed_tokens.weight");
      if (embed != nullptr && embed->shape == t.shape && embed->to_bf16() == t.to_bf16()) continue;
    }
    problems.extra.push_back(name);
  }
  return problems;
}

void validate_weights(const ModelWeights& weights, const ModelConfig& config) {
  const WeightProblems problems = check_weights(weights, config);
  if (!problems.ok()) throw FormatError("weights do not match the config: " + problems.message());
}

}  // namespace fp8serve
