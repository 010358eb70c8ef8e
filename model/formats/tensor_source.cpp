#include "model/formats/tensor_source.hpp"

#include <cstring>

#include "kernels/fp8.hpp"
#include "model/formats/dequant.hpp"
#include "model/formats/gguf.hpp"
#include "model/formats/safetensors.hpp"

namespace fp8serve {
namespace {

class GgufSource final : public TensorSource {
 public:
  GgufSource(std::shared_ptr<const GgufFile> file, const GgufTensorInfo& info, int64_t rows, int64_t cols,
             int unpermute_heads)
      : file_(std::move(file)), info_(info), rows_(rows), cols_(cols), heads_(unpermute_heads) {
    const std::span<const uint8_t> data = file_->tensor_data(info_);
    if (rows_ < 1 || cols_ < 1 || data.size() % static_cast<std::size_t>(rows_) != 0) {
      throw FormatError("GGUF: tensor '" + info_.name + "' does not split into " + std::to_string(rows_) + " rows");
    }
    row_bytes_ = data.size() / static_cast<std::size_t>(rows_);
    if (heads_ > 0 && (rows_ % heads_ != 0 || (rows_ / heads_) % 2 != 0)) {
      throw FormatError("GGUF: tensor '" + info_.name + "' has " + std::to_string(rows_) +
                        " rows, not num_heads x an even head dim");
    }
  }

  void read_rows(int64_t begin, int64_t end, float* out) const override {
    const std::span<const uint8_t> data = file_->tensor_data(info_);
    for (int64_t r = begin; r < end; ++r) {
      const auto src = static_cast<std::size_t>(stored_row(r)) * row_bytes_;
      try {
        dequantize_ggml(info_.type, data.subspan(src, row_bytes_),
                        std::span<float>(out + (r - begin) * cols_, static_cast<std::size_t>(cols_)));
      } catch (const FormatError& e) {
        throw FormatError("GGUF: tensor '" + info_.name + "': " + e.what());
      }
    }
  }

  std::string_view stored_type() const override { return ggml_type_name(info_.type); }

 private:
  // llama.cpp's converter permutes the rows of q_proj and k_proj of llama-family models so that
  // its rope can rotate adjacent pairs (GPT-J style) instead of the two halves of each head
  // (HF/NeoX style): GGUF row h*hd + 2*i + j holds HF row h*hd + j*hd/2 + i.
  int64_t stored_row(int64_t hf_row) const {
    if (heads_ == 0) return hf_row;
    const int64_t head_dim = rows_ / heads_, half = head_dim / 2;
    const int64_t h = hf_row / head_dim, within = hf_row % head_dim;
    return h * head_dim + 2 * (within % half) + within / half;
  }

  std::shared_ptr<const GgufFile> file_;
  const GgufTensorInfo& info_;  // owned by file_
  int64_t rows_, cols_;
  int heads_;
  std::size_t row_bytes_ = 0;
};

class SafetensorsSource final : public TensorSource {
 public:
  SafetensorsSource(std::shared_ptr<const SafetensorsModel> model, const SafetensorsTensor& tensor, int64_t rows,
                    int64_t cols, Fp8Weight fp8)
      : model_(std::move(model)), tensor_(tensor), cols_(cols), fp8_(std::move(fp8)) {
    if (rows < 1 || cols < 1 || rows * cols != tensor_.num_elements()) {
      throw FormatError("safetensors: tensor '" + tensor_.name + "' is not " + std::to_string(rows) + " x " +
                        std::to_string(cols));
    }
    switch (tensor_.dtype) {
      case SafetensorsDtype::bf16:
      case SafetensorsDtype::f16:
      case SafetensorsDtype::f32:
        break;
      case SafetensorsDtype::f8_e4m3:
        if (fp8_.scales.empty()) throw FormatError("safetensors: F8_E4M3 tensor '" + tensor_.name + "' has no scales");
        break;
      default:
        throw FormatError("safetensors: tensor '" + tensor_.name + "' has dtype " +
                          std::string(safetensors_dtype_name(tensor_.dtype)) +
                          " (supported: BF16, F16, F32, and F8_E4M3 with its scales)");
    }
  }

  void read_rows(int64_t begin, int64_t end, float* out) const override {
    const uint8_t* src = tensor_.data.data();
    const int64_t first = begin * cols_, n = (end - begin) * cols_;
    switch (tensor_.dtype) {
      case SafetensorsDtype::bf16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * (first + i), 2);
          out[i] = bf16_to_f32(h);
        }
        return;
      case SafetensorsDtype::f16:
        for (int64_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * (first + i), 2);
          out[i] = f16_to_f32(h);
        }
        return;
      case SafetensorsDtype::f32:
        std::memcpy(out, src + 4 * first, static_cast<std::size_t>(n) * 4);
        return;
      default: {  // F8_E4M3: decode * the scale of the value's block
        const int64_t block = fp8_.block_k > 0 ? fp8_.block_k : cols_;
        const int64_t num_blocks = (cols_ + block - 1) / block;
        for (int64_t r = begin; r < end; ++r) {
          for (int64_t k = 0; k < cols_; ++k) {
            out[(r - begin) * cols_ + k] = fp8_e4m3_decode(fp8_.codes[static_cast<std::size_t>(r * cols_ + k)]) *
                                           fp8_.scales[static_cast<std::size_t>(r * num_blocks + k / block)];
          }
        }
        return;
      }
    }
  }

  const Fp8Weight* fp8() const override {
    return tensor_.dtype == SafetensorsDtype::f8_e4m3 ? &fp8_ : nullptr;
  }
  std::string_view stored_type() const override { return safetensors_dtype_name(tensor_.dtype); }

 private:
  std::shared_ptr<const SafetensorsModel> model_;
  const SafetensorsTensor& tensor_;  // owned by model_
  int64_t cols_;
  Fp8Weight fp8_;
};

}  // namespace

std::shared_ptr<const TensorSource> gguf_tensor_source(std::shared_ptr<const GgufFile> file,
                                                       const GgufTensorInfo& info, int64_t rows,
                                                       int64_t cols, int unpermute_heads) {
  return std::make_shared<GgufSource>(std::move(file), info, rows, cols, unpermute_heads);
}

std::shared_ptr<const TensorSource> safetensors_tensor_source(std::shared_ptr<const SafetensorsModel> model,
                                                              const SafetensorsTensor& tensor, int64_t rows,
                                                              int64_t cols, Fp8Weight fp8) {
  return std::make_shared<SafetensorsSource>(std::move(model), tensor, rows, cols, std::move(fp8));
}

}  // namespace fp8serve
