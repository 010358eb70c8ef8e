#pragma once
// safetensors reader: one file (mmap, or an in-memory image for tests and fuzzing) and a model
// directory of one file or several shards (model.safetensors.index.json). The header is hostile
// input: its size, JSON, dtypes, shapes and data_offsets are all checked (inside the data region,
// byte count matching the shape, no two tensors overlapping) before any data is touched.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/format_error.hpp"

namespace fp8serve {

enum class SafetensorsDtype { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean, f8_e4m3, f8_e5m2 };

std::string_view safetensors_dtype_name(SafetensorsDtype dtype);  // as in the header: "BF16"
int64_t safetensors_dtype_size(SafetensorsDtype dtype);           // bytes per element

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::f32;
  std::vector<int64_t> shape;      // row-major, as written (HF: [out_features, in_features])
  std::span<const uint8_t> data;   // points into the owning SafetensorsFile's bytes
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);           // mmap, throws FormatError
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes);  // tests and fuzzing

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;  // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Storage;
  SafetensorsFile() = default;
  void parse(std::span<const uint8_t> bytes);

  std::shared_ptr<const Storage> storage_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;  // the optional "__metadata__" string map
};

// All tensors of a Hugging Face model directory: model.safetensors, or the shards listed in
// model.safetensors.index.json (every listed tensor must be in the shard the index names; a
// tensor in two shards is an error).
class SafetensorsModel {
 public:
  static SafetensorsModel open_dir(const std::string& model_dir);

  const SafetensorsTensor* find(std::string_view name) const;
  std::vector<const SafetensorsTensor*> tensors() const;  // sorted by name

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name_;
};

}  // namespace fp8serve
