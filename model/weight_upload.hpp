#pragma once
// Uploads a model's weights to the backend, tensor by tensor and rows by rows from their mapped
// files (model/formats/tensor_source.hpp): bf16 as stored or rounded, or FP8 E4M3 in the one
// representation of kernels/forward_ops.hpp (LinearParams) - as an FP8 checkpoint ships it, or
// quantized per output channel at load (--quantization fp8, kernels/fp8_quantize.hpp). The host
// never holds more than a few rows of a tensor in converted form.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/formats/weights.hpp"

namespace fp8serve {

// A projection's weights on the device, ready for LinearParams.
struct DeviceProjection {
  const void* weight = nullptr;          // [out, in] bf16 or E4M3 codes
  WeightDtype dtype = WeightDtype::bf16;
  const float* scales = nullptr;         // FP8: [out, num_k_blocks]
  int64_t block_k = 0;                   // FP8: inputs per scale; 0 = one scale per row
  int64_t out_features = 0;
  int64_t in_features = 0;
};

// What was uploaded, in bytes.
struct WeightBytes {
  uint64_t bf16 = 0;            // bf16 tensors: embeddings, norms, biases, bf16 projections
  uint64_t fp8 = 0;             // FP8 codes
  uint64_t fp8_scales = 0;      // their fp32 scales
  uint64_t fp8_as_bf16 = 0;     // what the FP8 projections would take in bf16
  uint64_t arena = 0;           // the arena they take, alignment included
  uint64_t total() const { return bf16 + fp8 + fp8_scales; }
};

// All of a model's weights live in one device allocation (an arena): on the CPU that gives them
// 2 MiB pages, where separate buffers of a few hundred KiB (an FP8 projection of SmolLM2) got 4 KiB
// pages, a TLB miss and a hardware-prefetch restart every 4 KiB of the batch-1 weight stream. So
// the weights are uploaded twice over the same calls: a planning pass that only adds up the bytes
// (planning = true: nothing is read, pointers are null), then the real one into an arena of that
// size.
class WeightUploader {
 public:
  // The real pass allocates one arena of `arena_bytes` (what a planning pass's bytes().arena
  // said) and keeps it in `buffers` (owned by the caller, freed with it); with arena_bytes = 0,
  // one buffer per tensor instead (tests).
  WeightUploader(Backend& backend, Stream stream, std::vector<DeviceBuffer>& buffers, bool planning,
                 std::size_t arena_bytes = 0);

  // The named tensors concatenated along their first dimension, as bf16.
  const std::uint16_t* bf16(const ModelWeights& weights, std::initializer_list<std::string> names);

  // A projection, the named tensors concatenated along their first dimension (whole rows, so
  // per-row quantization commutes with the fusion). FP8 when `quantize` is set or any part is
  // stored FP8 (the other parts are then quantized too), else bf16. FP8 parts keep their codes and
  // scales exactly; a fusion that mixes block scales with per-row ones repeats the per-row scale
  // over the blocks (exact). FormatError when parts have different block sizes.
  DeviceProjection projection(const ModelWeights& weights, std::initializer_list<std::string> names,
                              bool quantize);

  const WeightBytes& bytes() const { return bytes_; }

 private:
  void* allocate(std::size_t bytes);

  Backend& backend_;
  Stream stream_;
  std::vector<DeviceBuffer>& buffers_;
  bool planning_;
  char* arena_ = nullptr;
  std::size_t arena_size_ = 0;
  WeightBytes bytes_;
};

}  // namespace fp8serve
