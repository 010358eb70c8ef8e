#pragma once
// Where a weight's values come from until it is uploaded: the tensor as stored in its mapped file
// (GGUF block types, safetensors BF16 / F16 / F32 / F8_E4M3), decoded a few rows at a time on
// demand. So a model is converted tensor by tensor, rows by rows, into the backend's format (bf16,
// or FP8 with --quantization fp8) without a full bf16 copy of it on the host: the peak holds the
// mapped file and the uploaded weights. A source keeps its file mapped while it lives.
//
// Tensors are seen as [rows, cols]: rows = shape[0], cols = the product of the other dimensions
// (1-D tensors: one row).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve {

class GgufFile;
struct GgufTensorInfo;
class SafetensorsModel;
struct SafetensorsTensor;

// An FP8 E4M3 checkpoint weight as published, scales expanded to one array per row: the
// representation of kernels/forward_ops.hpp (LinearParams) without a conversion.
struct Fp8Weight {
  std::span<const uint8_t> codes;  // [rows, cols] E4M3, no NaN codes (checked at load)
  std::vector<float> scales;       // [rows, num_k_blocks] fp32, finite and positive
  int64_t block_k = 0;             // inputs per scale; 0: one scale per row
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Rows [begin, end) in fp32: exact for BF16 / F16 / F32 and FP8 (decode * scale), GGUF block
  // types dequantized as gguf-py does. out holds (end - begin) * cols floats.
  virtual void read_rows(int64_t begin, int64_t end, float* out) const = 0;
  // The stored FP8 codes and scales of an FP8 checkpoint weight; nullptr for other tensors.
  virtual const Fp8Weight* fp8() const { return nullptr; }
  // The stored type, as the file names it ("Q4_1", "BF16", "F8_E4M3"), for logs.
  virtual std::string_view stored_type() const = 0;
};

// A GGUF tensor of `rows` x `cols` (HF orientation). unpermute_heads > 0 undoes llama.cpp's Q/K
// rotary row permutation for that many heads (weights.cpp). Keeps `file` alive.
std::shared_ptr<const TensorSource> gguf_tensor_source(std::shared_ptr<const GgufFile> file,
                                                       const GgufTensorInfo& info, int64_t rows,
                                                       int64_t cols, int unpermute_heads);

// A safetensors tensor (BF16, F16, F32; F8_E4M3 with `fp8` filled in). FormatError naming the
// tensor for other dtypes. Keeps `model` alive.
std::shared_ptr<const TensorSource> safetensors_tensor_source(std::shared_ptr<const SafetensorsModel> model,
                                                              const SafetensorsTensor& tensor, int64_t rows,
                                                              int64_t cols, Fp8Weight fp8 = {});

}  // namespace fp8serve
