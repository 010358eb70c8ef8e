#pragma once
// GGUF (v2 and v3, little-endian) reader. The file is hostile input: every count, length, offset
// and shape is bounds-checked with overflow-safe arithmetic before it is used, and any violation
// throws FormatError naming what was wrong. Metadata is parsed eagerly (it is small); tensor
// data stays in the mapping and is handed out as spans.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/formats/format_error.hpp"

namespace fp8serve {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

// Tensor element types, numbered as ggml's ggml_type. Only storage types whose block size we know
// are listed (q8_1, a compute-only type, is not); any other number in a file is rejected at open.
// Which of them can be dequantized is weights.hpp's business.
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
  q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
  iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22,
  iq4_xs = 23, i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30,
  tq1_0 = 34, tq2_0 = 35, mxfp4 = 39, nvfp4 = 40, q1_0 = 41,
};

std::string_view gguf_value_type_name(GgufValueType type);
std::string_view ggml_type_name(GgmlType type);
// Elements per block and bytes per block of a tensor type (f32: 1 and 4; q4_1: 32 and 20).
int64_t ggml_block_size(GgmlType type);
int64_t ggml_type_size(GgmlType type);

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<int64_t> shape;  // ggml "ne" order: shape[0] is the contiguous (fastest) dimension
  uint64_t offset = 0;         // from the start of the tensor data section
  uint64_t nbytes = 0;
  int64_t num_elements() const;
};

// One metadata value. Arrays keep their element type; numeric arrays are widened to int64 or
// double (u64 values above INT64_MAX are rejected at open so the widening is lossless).
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType array_type = GgufValueType::u8;  // meaningful when type == array
  int64_t int_value = 0;                         // every integer type, and bool (0/1)
  double float_value = 0.0;                      // f32 / f64
  std::string string_value;
  std::vector<int64_t> int_array;                // integer and bool arrays
  std::vector<double> float_array;               // f32 / f64 arrays
  std::vector<std::string> string_array;
  uint64_t array_size() const;
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);           // mmap, throws FormatError
  static GgufFile from_bytes(std::vector<uint8_t> bytes);  // tests and fuzzing

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the tensor data section starts
  bool has(std::string_view key) const;
  // Typed getters: nullopt when the key is absent, FormatError (naming the key) when present
  // with another type. get_int accepts any integer type, get_float f32/f64 and integers.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // Array getters: empty when absent, FormatError when present with another element type.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;  // float and integer arrays
  std::vector<int64_t> get_int_array(std::string_view key) const;    // integer and bool arrays

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
  std::span<const uint8_t> tensor_data(const GgufTensorInfo& info) const;

  std::vector<std::string> metadata_keys() const;  // in file order
  const GgufValue* value(std::string_view key) const;  // nullptr when absent
  // One line for `inspect`: "u32 30", "str \"llama\"", "[str x 49152] \"<|endoftext|>\", ...".
  std::string describe(std::string_view key) const;

 private:
  struct Storage;  // owns the bytes: an mmap'd file or a vector
  GgufFile() = default;
  void parse();

  std::shared_ptr<const Storage> storage_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;  // absolute offset of the tensor data section
  std::vector<std::string> key_order_;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace fp8serve
