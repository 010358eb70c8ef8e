#include "model/formats/gguf.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "model/formats/mapped_file.hpp"

namespace fp8serve {
namespace {

// Caps on hostile sizes. Each is far above anything a real model file holds (the largest
// strings are chat templates of a few tens of KiB; the largest arrays are vocabularies of a few
// hundred thousand entries) and keeps a forged count from asking for absurd allocations.
constexpr uint64_t kMaxKeyLength = 65535;           // the GGUF spec's own limit for keys
constexpr uint64_t kMaxStringLength = 64ull << 20;  // 64 MiB
constexpr uint64_t kMaxArrayLength = 1ull << 26;    // 67M elements
constexpr uint64_t kMaxTensorNameLength = 4096;
constexpr uint32_t kMaxDims = 4;                    // GGML_MAX_DIMS
constexpr uint64_t kMaxAlignment = 1ull << 20;

struct TypeTraits {
  GgmlType type;
  const char* name;
  int64_t block_size;
  int64_t type_size;
};

// Block sizes as in ggml (and gguf-py's GGML_QUANT_SIZES).
constexpr TypeTraits kTypes[] = {
    {GgmlType::f32, "F32", 1, 4},          {GgmlType::f16, "F16", 1, 2},
    {GgmlType::q4_0, "Q4_0", 32, 18},      {GgmlType::q4_1, "Q4_1", 32, 20},
    {GgmlType::q5_0, "Q5_0", 32, 22},      {GgmlType::q5_1, "Q5_1", 32, 24},
    {GgmlType::q8_0, "Q8_0", 32, 34},      {GgmlType::q2_k, "Q2_K", 256, 84},
    {GgmlType::q3_k, "Q3_K", 256, 110},    {GgmlType::q4_k, "Q4_K", 256, 144},
    {GgmlType::q5_k, "Q5_K", 256, 176},    {GgmlType::q6_k, "Q6_K", 256, 210},
    {GgmlType::q8_k, "Q8_K", 256, 292},    {GgmlType::iq2_xxs, "IQ2_XXS", 256, 66},
    {GgmlType::iq2_xs, "IQ2_XS", 256, 74}, {GgmlType::iq3_xxs, "IQ3_XXS", 256, 98},
    {GgmlType::iq1_s, "IQ1_S", 256, 50},   {GgmlType::iq4_nl, "IQ4_NL", 32, 18},
    {GgmlType::iq3_s, "IQ3_S", 256, 110},  {GgmlType::iq2_s, "IQ2_S", 256, 82},
    {GgmlType::iq4_xs, "IQ4_XS", 256, 136}, {GgmlType::i8, "I8", 1, 1},
    {GgmlType::i16, "I16", 1, 2},          {GgmlType::i32, "I32", 1, 4},
    {GgmlType::i64, "I64", 1, 8},          {GgmlType::f64, "F64", 1, 8},
    {GgmlType::iq1_m, "IQ1_M", 256, 56},   {GgmlType::bf16, "BF16", 1, 2},
    {GgmlType::tq1_0, "TQ1_0", 256, 54},   {GgmlType::tq2_0, "TQ2_0", 256, 66},
    {GgmlType::mxfp4, "MXFP4", 32, 17},    {GgmlType::nvfp4, "NVFP4", 64, 36},
    {GgmlType::q1_0, "Q1_0", 128, 18},
};

const TypeTraits* find_type(uint32_t raw) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  }
  return nullptr;
}

const TypeTraits& type_traits(GgmlType type) {
  const TypeTraits* t = find_type(static_cast<uint32_t>(type));
  if (t == nullptr) {
    throw FormatError("GGUF: unknown tensor type " + std::to_string(static_cast<uint32_t>(type)));
  }
  return *t;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// Little-endian reader over the file image; every read is bounds-checked and failures name the
// thing being read and the offset, so a corrupted file says where it broke.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  const uint8_t* take(uint64_t n, std::string_view what) {
    if (n > remaining()) {
      throw FormatError("GGUF: truncated file: " + std::string(what) + " needs " +
                        std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                        ", only " + std::to_string(remaining()) + " left");
    }
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

  template <typename T>
  T read(std::string_view what) {
    T value;
    std::memcpy(&value, take(sizeof(T), what), sizeof(T));  // host is little-endian (x86/arm64)
    return value;
  }

  std::string read_string(uint64_t max_length, std::string_view what) {
    const uint64_t length = read<uint64_t>(what);
    if (length > max_length) {
      throw FormatError("GGUF: " + std::string(what) + " has length " + std::to_string(length) +
                        " at offset " + std::to_string(pos_ - 8) + " (limit " +
                        std::to_string(max_length) + ")");
    }
    const uint8_t* p = take(length, what);
    return std::string(reinterpret_cast<const char*>(p), length);
  }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

std::string key_context(const std::string& key) { return "value of key '" + key + "'"; }

// Reads one scalar of `type` into `out` (as int, float, bool or string).
void read_scalar(Cursor& cur, GgufValueType type, const std::string& key, GgufValue& out) {
  const std::string what = key_context(key);
  switch (type) {
    case GgufValueType::u8: out.int_value = cur.read<uint8_t>(what); return;
    case GgufValueType::i8: out.int_value = cur.read<int8_t>(what); return;
    case GgufValueType::u16: out.int_value = cur.read<uint16_t>(what); return;
    case GgufValueType::i16: out.int_value = cur.read<int16_t>(what); return;
    case GgufValueType::u32: out.int_value = cur.read<uint32_t>(what); return;
    case GgufValueType::i32: out.int_value = cur.read<int32_t>(what); return;
    case GgufValueType::i64: out.int_value = cur.read<int64_t>(what); return;
    case GgufValueType::u64: {
      const uint64_t v = cur.read<uint64_t>(what);
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw FormatError("GGUF: u64 " + what + " is " + std::to_string(v) +
                          ", above the supported range (INT64_MAX)");
      }
      out.int_value = static_cast<int64_t>(v);
      return;
    }
    case GgufValueType::f32: out.float_value = cur.read<float>(what); return;
    case GgufValueType::f64: out.float_value = cur.read<double>(what); return;
    case GgufValueType::boolean: {
      const uint8_t v = cur.read<uint8_t>(what);
      if (v > 1) {
        throw FormatError("GGUF: bool " + what + " has byte value " + std::to_string(v));
      }
      out.int_value = v;
      return;
    }
    case GgufValueType::string: out.string_value = cur.read_string(kMaxStringLength, what); return;
    case GgufValueType::array: break;
  }
  throw FormatError("GGUF: " + what + " has unknown type " +
                    std::to_string(static_cast<uint32_t>(type)));
}

bool is_valid_value_type(uint32_t raw) { return raw <= static_cast<uint32_t>(GgufValueType::f64); }

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16:
    case GgufValueType::i16: case GgufValueType::u32: case GgufValueType::i32:
    case GgufValueType::u64: case GgufValueType::i64:
      return true;
    default:
      return false;
  }
}

bool is_float(GgufValueType t) { return t == GgufValueType::f32 || t == GgufValueType::f64; }

// Smallest encoding of one element, used to reject counts the remaining bytes cannot hold
// before anything is allocated.
uint64_t min_encoded_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    default: return 8;  // 64-bit scalars, and strings (their u64 length)
  }
}

GgufValue read_value(Cursor& cur, GgufValueType type, const std::string& key) {
  GgufValue value;
  value.type = type;
  if (type != GgufValueType::array) {
    read_scalar(cur, type, key, value);
    return value;
  }
  const std::string what = key_context(key);
  const uint32_t raw_elem = cur.read<uint32_t>(what);
  if (!is_valid_value_type(raw_elem)) {
    throw FormatError("GGUF: array " + what + " has unknown element type " +
                      std::to_string(raw_elem));
  }
  const auto elem = static_cast<GgufValueType>(raw_elem);
  if (elem == GgufValueType::array) {
    throw FormatError("GGUF: array " + what + " holds nested arrays (not supported)");
  }
  value.array_type = elem;
  const uint64_t count = cur.read<uint64_t>(what);
  if (count > kMaxArrayLength || count > cur.remaining() / min_encoded_size(elem)) {
    throw FormatError("GGUF: array " + what + " claims " + std::to_string(count) +
                      " elements, more than the file can hold (offset " +
                      std::to_string(cur.pos()) + ")");
  }
  GgufValue elem_value;
  if (elem == GgufValueType::string) {
    value.string_array.reserve(count);
  } else if (is_float(elem)) {
    value.float_array.reserve(count);
  } else {
    value.int_array.reserve(count);
  }
  for (uint64_t i = 0; i < count; ++i) {
    read_scalar(cur, elem, key, elem_value);
    if (elem == GgufValueType::string) {
      value.string_array.push_back(std::move(elem_value.string_value));
    } else if (is_float(elem)) {
      value.float_array.push_back(elem_value.float_value);
    } else {
      value.int_array.push_back(elem_value.int_value);
    }
  }
  return value;
}

std::string quote(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const char c = s[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  if (s.size() > max_chars) out += "...";
  return out + "\"";
}

std::string format_double(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

}  // namespace

std::string_view gguf_value_type_name(GgufValueType type) {
  static constexpr const char* kNames[] = {"u8",  "i8",  "u16", "i16", "u32", "i32", "f32",
                                           "bool", "str", "arr", "u64", "i64", "f64"};
  const auto raw = static_cast<uint32_t>(type);
  return raw < std::size(kNames) ? kNames[raw] : "?";
}

std::string_view ggml_type_name(GgmlType type) {
  const TypeTraits* t = find_type(static_cast<uint32_t>(type));
  return t != nullptr ? t->name : "?";
}

int64_t ggml_block_size(GgmlType type) { return type_traits(type).block_size; }
int64_t ggml_type_size(GgmlType type) { return type_traits(type).type_size; }

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded when the info was parsed
  return n;
}

uint64_t GgufValue::array_size() const {
  if (type != GgufValueType::array) return 0;
  if (array_type == GgufValueType::string) return string_array.size();
  if (is_float(array_type)) return float_array.size();
  return int_array.size();
}

struct GgufFile::Storage {
  MappedFile mapping;
  std::vector<uint8_t> owned;
};

GgufFile GgufFile::open(const std::string& path) {
  auto storage = std::make_shared<Storage>();
  storage->mapping = MappedFile::open(path);
  GgufFile file;
  file.bytes_ = storage->mapping.bytes();
  file.storage_ = std::move(storage);
  try {
    file.parse();
  } catch (const FormatError& e) {
    throw FormatError(path + ": " + e.what());
  }
  return file;
}

GgufFile GgufFile::from_bytes(std::vector<uint8_t> bytes) {
  auto storage = std::make_shared<Storage>();
  storage->owned = std::move(bytes);
  GgufFile file;
  file.bytes_ = std::span<const uint8_t>(storage->owned);
  file.storage_ = std::move(storage);
  file.parse();
  return file;
}

void GgufFile::parse() {
  Cursor cur(bytes_);
  const uint8_t* magic = cur.take(4, "magic");
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    throw FormatError("not a GGUF file (magic is not 'GGUF')");
  }
  version_ = cur.read<uint32_t>("version");
  if (version_ == 1) {
    throw FormatError("GGUF: version 1 is not supported (re-convert the model to GGUF v3)");
  }
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0 && (version_ >> 24) <= 3) {
      throw FormatError("GGUF: big-endian files are not supported");
    }
    throw FormatError("GGUF: unsupported version " + std::to_string(version_));
  }
  const uint64_t num_tensors = cur.read<uint64_t>("tensor count");
  const uint64_t num_kv = cur.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8.
  if (num_kv > cur.remaining() / 13) {
    throw FormatError("GGUF: metadata count " + std::to_string(num_kv) +
                      " is more than the file can hold");
  }
  if (num_tensors > cur.remaining() / 24) {
    throw FormatError("GGUF: tensor count " + std::to_string(num_tensors) +
                      " is more than the file can hold");
  }

  key_order_.reserve(num_kv);
  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key = cur.read_string(kMaxKeyLength, "metadata key #" + std::to_string(i));
    const uint32_t raw_type = cur.read<uint32_t>("type of key '" + key + "'");
    if (!is_valid_value_type(raw_type)) {
      throw FormatError("GGUF: key '" + key + "' has unknown value type " +
                        std::to_string(raw_type));
    }
    GgufValue value = read_value(cur, static_cast<GgufValueType>(raw_type), key);
    if (metadata_.count(key) != 0) {
      throw FormatError("GGUF: duplicate metadata key '" + key + "'");
    }
    key_order_.push_back(key);
    metadata_.emplace(std::move(key), std::move(value));
  }

  if (const GgufValue* a = value("general.alignment")) {
    if (!is_integer(a->type) || a->int_value <= 0 ||
        static_cast<uint64_t>(a->int_value) > kMaxAlignment ||
        (a->int_value & (a->int_value - 1)) != 0) {
      throw FormatError("GGUF: general.alignment must be a power of two up to " +
                        std::to_string(kMaxAlignment) + ", got " + describe("general.alignment"));
    }
    alignment_ = static_cast<uint64_t>(a->int_value);
  }

  tensors_.reserve(num_tensors);
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo info;
    info.name = cur.read_string(kMaxTensorNameLength, "tensor name #" + std::to_string(i));
    const std::string ctx = "tensor '" + info.name + "'";
    const uint32_t num_dims = cur.read<uint32_t>(ctx + " dimension count");
    if (num_dims > kMaxDims) {
      throw FormatError("GGUF: " + ctx + " has " + std::to_string(num_dims) +
                        " dimensions (at most 4)");
    }
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      const uint64_t ne = cur.read<uint64_t>(ctx + " shape");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          !checked_mul(num_elements, ne, &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw FormatError("GGUF: " + ctx + " has an element count that overflows");
      }
      info.shape.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t raw_type = cur.read<uint32_t>(ctx + " type");
    const TypeTraits* traits = find_type(raw_type);
    if (traits == nullptr) {
      throw FormatError("GGUF: " + ctx + " has unknown tensor type " + std::to_string(raw_type));
    }
    info.type = traits->type;
    const uint64_t row = info.shape.empty() ? 1 : static_cast<uint64_t>(info.shape[0]);
    if (row % static_cast<uint64_t>(traits->block_size) != 0) {
      throw FormatError("GGUF: " + ctx + " of type " + traits->name + " has a row of " +
                        std::to_string(row) + " elements, not a multiple of its block size " +
                        std::to_string(traits->block_size));
    }
    // num_elements is a multiple of block_size here, so this is the exact byte count.
    if (!checked_mul(num_elements / static_cast<uint64_t>(traits->block_size),
                     static_cast<uint64_t>(traits->type_size), &info.nbytes)) {
      throw FormatError("GGUF: " + ctx + " byte size overflows");
    }
    info.offset = cur.read<uint64_t>(ctx + " offset");
    if (info.offset % alignment_ != 0) {
      throw FormatError("GGUF: " + ctx + " offset " + std::to_string(info.offset) +
                        " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (tensor_index_.count(info.name) != 0) {
      throw FormatError("GGUF: duplicate tensor name '" + info.name + "'");
    }
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t end_of_infos = cur.pos();
  const uint64_t padding = (alignment_ - end_of_infos % alignment_) % alignment_;
  data_offset_ = end_of_infos + padding;
  const uint64_t file_size = bytes_.size();
  const uint64_t data_size = data_offset_ <= file_size ? file_size - data_offset_ : 0;
  if (!tensors_.empty() && data_offset_ > file_size) {
    throw FormatError("GGUF: truncated file: tensor data section starts at " +
                      std::to_string(data_offset_) + ", past the end (" +
                      std::to_string(file_size) + " bytes)");
  }
  for (const auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      throw FormatError("GGUF: tensor '" + t.name + "' data [" + std::to_string(t.offset) +
                        ", +" + std::to_string(t.nbytes) + ") lies outside the data section (" +
                        std::to_string(data_size) + " bytes): truncated or corrupted file");
    }
  }
  // Overlapping tensors mean a corrupted table (two names reading the same bytes).
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : tensors_) {
    if (t.nbytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->offset + by_offset[i - 1]->nbytes > by_offset[i]->offset) {
      throw FormatError("GGUF: tensors '" + by_offset[i - 1]->name + "' and '" +
                        by_offset[i]->name + "' overlap");
    }
  }
}

bool GgufFile::has(std::string_view key) const { return metadata_.find(key) != metadata_.end(); }

const GgufValue* GgufFile::value(std::string_view key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, std::string_view wanted) {
  std::string got(gguf_value_type_name(v.type));
  if (v.type == GgufValueType::array) got += " of " + std::string(gguf_value_type_name(v.array_type));
  throw FormatError("GGUF: key '" + std::string(key) + "' is " + got + ", expected " +
                    std::string(wanted));
}
}  // namespace

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::string) wrong_type(key, *v, "a string");
  return v->string_value;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer(v->type)) wrong_type(key, *v, "an integer");
  return v->int_value;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (is_float(v->type)) return v->float_value;
  if (is_integer(v->type)) return static_cast<double>(v->int_value);
  wrong_type(key, *v, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::boolean) wrong_type(key, *v, "a bool");
  return v->int_value != 0;
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return {};
  if (v->type != GgufValueType::array || v->array_type != GgufValueType::string) {
    wrong_type(key, *v, "an array of strings");
  }
  return v->string_array;
}

std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return {};
  if (v->type != GgufValueType::array) wrong_type(key, *v, "an array of numbers");
  if (is_float(v->array_type)) return v->float_array;
  if (is_integer(v->array_type)) return {v->int_array.begin(), v->int_array.end()};
  wrong_type(key, *v, "an array of numbers");
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return {};
  if (v->type != GgufValueType::array ||
      !(is_integer(v->array_type) || v->array_type == GgufValueType::boolean)) {
    wrong_type(key, *v, "an array of integers");
  }
  return v->int_array;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::tensor_data(const GgufTensorInfo& info) const {
  // Only infos of this file are valid; re-check so a foreign info cannot read out of bounds.
  const GgufTensorInfo* own = find_tensor(info.name);
  if (own == nullptr || own->offset != info.offset || own->nbytes != info.nbytes) {
    throw FormatError("GGUF: tensor '" + info.name + "' does not belong to this file");
  }
  return bytes_.subspan(data_offset_ + own->offset, own->nbytes);
}

std::vector<std::string> GgufFile::metadata_keys() const { return key_order_; }

std::string GgufFile::describe(std::string_view key) const {
  const GgufValue* v = value(key);
  if (v == nullptr) return "(absent)";
  constexpr size_t kMaxShown = 4;
  constexpr size_t kMaxChars = 60;
  std::string out;
  if (v->type != GgufValueType::array) {
    out = std::string(gguf_value_type_name(v->type)) + " ";
    if (v->type == GgufValueType::string) return out + quote(v->string_value, kMaxChars);
    if (v->type == GgufValueType::boolean) return out + (v->int_value != 0 ? "true" : "false");
    if (is_float(v->type)) return out + format_double(v->float_value);
    return out + std::to_string(v->int_value);
  }
  const uint64_t n = v->array_size();
  out = "[" + std::string(gguf_value_type_name(v->array_type)) + " x " + std::to_string(n) + "]";
  for (size_t i = 0; i < n && i < kMaxShown; ++i) {
    out += i == 0 ? " " : ", ";
    if (v->array_type == GgufValueType::string) {
      out += quote(v->string_array[i], kMaxChars);
    } else if (is_float(v->array_type)) {
      out += format_double(v->float_array[i]);
    } else {
      out += std::to_string(v->int_array[i]);
    }
  }
  if (n > kMaxShown) out += ", ...";
  return out;
}

}  // namespace fp8serve
