#include "model/formats/fp8_checkpoint.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/formats/dequant.hpp"
#include "model/formats/safetensors.hpp"

namespace fp8serve {
namespace {

constexpr std::string_view kScaleSuffixes[] = {".weight_scale_inv", ".weight_scale", ".input_scale"};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A scale tensor's values as fp32 (F32, BF16 or F16).
std::vector<float> scale_values(const SafetensorsTensor& t) {
  const auto n = static_cast<size_t>(t.num_elements());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype) {
      case SafetensorsDtype::f32:
        std::memcpy(&out[i], t.data.data() + 4 * i, 4);
        break;
      case SafetensorsDtype::bf16:
      case SafetensorsDtype::f16: {
        uint16_t h;
        std::memcpy(&h, t.data.data() + 2 * i, 2);
        out[i] = t.dtype == SafetensorsDtype::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
        break;
      }
      default:
        throw FormatError("safetensors: scale tensor '" + t.name + "' has dtype " +
                          std::string(safetensors_dtype_name(t.dtype)) + " (supported: F32, BF16, F16)");
    }
    if (!(std::isfinite(out[i]) && out[i] > 0.0f)) {
      throw FormatError("safetensors: scale tensor '" + t.name + "' holds " + std::to_string(out[i]) +
                        " (scales must be finite and positive)");
    }
  }
  return out;
}

}  // namespace

bool is_fp8_scale_name(std::string_view name) {
  for (const std::string_view suffix : kScaleSuffixes) {
    if (ends_with(name, suffix)) return true;
  }
  return false;
}

Fp8Weight fp8_checkpoint_weight(const SafetensorsModel& model, const SafetensorsTensor& weight,
                                const WeightQuantization& q) {
  const std::string& name = weight.name;
  auto fail = [&](const std::string& what) { throw FormatError("safetensors: F8_E4M3 tensor '" + name + "' " + what); };
  if (!q.fp8) fail("needs a quantization_config in config.json (none is declared)");
  if (weight.shape.size() != 2 || weight.shape[0] < 1 || weight.shape[1] < 1) {
    fail("must be a 2-D weight, got shape " + shape_str(weight.shape));
  }
  if (!ends_with(name, ".weight")) fail("is not a weight (its name does not end in .weight)");
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  Fp8Weight out;
  out.codes = weight.data;
  for (const uint8_t code : out.codes) {
    if ((code & 0x7f) == 0x7f) fail("holds NaN codes");
  }

  const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
  const SafetensorsTensor* scale_inv = model.find(base + ".weight_scale_inv");
  const SafetensorsTensor* scale = model.find(base + ".weight_scale");
  if ((scale_inv != nullptr) == (scale != nullptr)) {
    fail(scale ? "has both weight_scale and weight_scale_inv" : "has no weight_scale or weight_scale_inv");
  }
  const SafetensorsTensor& s = scale ? *scale : *scale_inv;
  const std::vector<float> values = scale_values(s);
  const int64_t n = static_cast<int64_t>(values.size());
  if (q.block_rows > 0 && s.shape.size() == 2 && s.shape[0] == (rows + q.block_rows - 1) / q.block_rows &&
      s.shape[1] == (cols + q.block_cols - 1) / q.block_cols) {
    // One scale per block of block_rows x block_cols: repeated on each of the block's rows.
    const int64_t num_k_blocks = s.shape[1];
    out.block_k = q.block_cols;
    out.scales.resize(static_cast<size_t>(rows * num_k_blocks));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < num_k_blocks; ++b) {
        out.scales[static_cast<size_t>(r * num_k_blocks + b)] = values[static_cast<size_t>((r / q.block_rows) * num_k_blocks + b)];
      }
    }
  } else if (scale_inv == nullptr && n == 1) {
    out.scales.assign(static_cast<size_t>(rows), values[0]);  // per tensor: the same on every row
  } else if (scale_inv == nullptr && n == rows && (s.shape.size() == 1 || (s.shape.size() == 2 && s.shape[1] == 1))) {
    out.scales = values;  // per output channel
  } else {
    fail("of shape " + shape_str(weight.shape) + " has a " + std::string(scale ? "weight_scale" : "weight_scale_inv") +
         " of shape " + shape_str(s.shape) + ", which is neither one scale, one per row, nor one per " +
         (q.block_rows > 0 ? std::to_string(q.block_rows) + " x " + std::to_string(q.block_cols) + " block"
                           : std::string("block (the config declares no weight_block_size)")));
  }
  return out;
}

void check_fp8_scales_have_weights(const SafetensorsModel& model) {
  for (const SafetensorsTensor* t : model.tensors()) {
    if (!is_fp8_scale_name(t->name)) continue;
    const std::string_view name = t->name;
    std::string_view base = name;
    for (const std::string_view suffix : kScaleSuffixes) {
      if (ends_with(name, suffix)) {
        base = name.substr(0, name.size() - suffix.size());
        break;
      }
    }
    const SafetensorsTensor* weight = model.find(std::string(base) + ".weight");
    if (weight == nullptr || weight->dtype != SafetensorsDtype::f8_e4m3) {
      throw FormatError("safetensors: scale tensor '" + t->name + "' has no F8_E4M3 weight '" + std::string(base) +
                        ".weight'");
    }
  }
}

}  // namespace fp8serve
