#include "model/formats/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "model/formats/mapped_file.hpp"

namespace fp8serve {
namespace {

using nlohmann::json;

// The safetensors format itself caps the header at 100 MB.
constexpr uint64_t kMaxHeaderSize = 100'000'000;
constexpr size_t kMaxDims = 8;

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int64_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::f64, "F64", 8},          {SafetensorsDtype::f32, "F32", 4},
    {SafetensorsDtype::f16, "F16", 2},          {SafetensorsDtype::bf16, "BF16", 2},
    {SafetensorsDtype::i64, "I64", 8},          {SafetensorsDtype::i32, "I32", 4},
    {SafetensorsDtype::i16, "I16", 2},          {SafetensorsDtype::i8, "I8", 1},
    {SafetensorsDtype::u8, "U8", 1},            {SafetensorsDtype::boolean, "BOOL", 1},
    {SafetensorsDtype::f8_e4m3, "F8_E4M3", 1},  {SafetensorsDtype::f8_e5m2, "F8_E5M2", 1},
};

const DtypeInfo& dtype_info(SafetensorsDtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[1];  // unreachable: every enumerator is listed
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t json_u64(const json& j, const std::string& what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0)) {
    throw FormatError("safetensors: " + what + " must be a non-negative integer, got " + j.dump());
  }
  return j.get<uint64_t>();
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDtype dtype) { return dtype_info(dtype).name; }
int64_t safetensors_dtype_size(SafetensorsDtype dtype) { return dtype_info(dtype).size; }

int64_t SafetensorsTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // overflow excluded when the header was parsed
  return n;
}

struct SafetensorsFile::Storage {
  MappedFile mapping;
  std::vector<uint8_t> owned;
};

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto storage = std::make_shared<Storage>();
  storage->mapping = MappedFile::open(path);
  SafetensorsFile file;
  const auto bytes = storage->mapping.bytes();
  file.storage_ = std::move(storage);
  try {
    file.parse(bytes);
  } catch (const FormatError& e) {
    throw FormatError(path + ": " + e.what());
  }
  return file;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes) {
  auto storage = std::make_shared<Storage>();
  storage->owned = std::move(bytes);
  SafetensorsFile file;
  const std::span<const uint8_t> view(storage->owned);
  file.storage_ = std::move(storage);
  file.parse(view);
  return file;
}

void SafetensorsFile::parse(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8) {
    throw FormatError("safetensors: truncated file (" + std::to_string(bytes.size()) +
                      " bytes, the header size alone takes 8)");
  }
  const uint64_t header_size = read_u64_le(bytes.data());
  if (header_size > kMaxHeaderSize || header_size > bytes.size() - 8) {
    throw FormatError("safetensors: header size " + std::to_string(header_size) +
                      " exceeds the file (" + std::to_string(bytes.size()) +
                      " bytes) or the 100 MB limit");
  }
  if (header_size < 2 || bytes[8] != '{') {
    throw FormatError("safetensors: header is not a JSON object");
  }
  const char* header = reinterpret_cast<const char*>(bytes.data() + 8);
  const json j = json::parse(header, header + header_size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw FormatError("safetensors: header is not valid JSON");
  }
  const std::span<const uint8_t> data = bytes.subspan(8 + header_size);

  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : j.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw FormatError("safetensors: __metadata__ must be an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          throw FormatError("safetensors: __metadata__ value of '" + k + "' is not a string");
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string ctx = "tensor '" + name + "'";
    if (!entry.is_object()) throw FormatError("safetensors: " + ctx + " entry is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || shape_it == entry.end() || offsets_it == entry.end()) {
      throw FormatError("safetensors: " + ctx + " needs dtype, shape and data_offsets");
    }
    SafetensorsTensor t;
    t.name = name;
    if (!dtype_it->is_string()) throw FormatError("safetensors: " + ctx + " dtype is not a string");
    const std::string dtype = dtype_it->get<std::string>();
    const DtypeInfo* info = nullptr;
    for (const auto& d : kDtypes) {
      if (dtype == d.name) info = &d;
    }
    if (info == nullptr) {
      throw FormatError("safetensors: " + ctx + " has unknown dtype '" + dtype + "'");
    }
    t.dtype = info->dtype;
    if (!shape_it->is_array() || shape_it->size() > kMaxDims) {
      throw FormatError("safetensors: " + ctx + " shape must be a list of at most 8 sizes");
    }
    uint64_t num_elements = 1;
    for (const auto& d : *shape_it) {
      const uint64_t dim = json_u64(d, ctx + " shape entry");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(num_elements, dim, &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw FormatError("safetensors: " + ctx + " element count overflows");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2) {
      throw FormatError("safetensors: " + ctx + " data_offsets must be [begin, end]");
    }
    const uint64_t begin = json_u64((*offsets_it)[0], ctx + " data_offsets");
    const uint64_t end = json_u64((*offsets_it)[1], ctx + " data_offsets");
    if (begin > end || end > data.size()) {
      throw FormatError("safetensors: " + ctx + " data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + "] lie outside the data region (" +
                        std::to_string(data.size()) + " bytes): truncated or corrupted file");
    }
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(num_elements, static_cast<uint64_t>(info->size), &nbytes) ||
        nbytes != end - begin) {
      throw FormatError("safetensors: " + ctx + " holds " + std::to_string(end - begin) +
                        " bytes, its " + dtype + " shape needs " +
                        std::to_string(num_elements) + " elements");
    }
    t.data = data.subspan(begin, end - begin);
    ranges.push_back({begin, end, tensors_.size()});
    index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].end > ranges[i].begin) {
      throw FormatError("safetensors: tensors '" + tensors_[ranges[i - 1].tensor].name +
                        "' and '" + tensors_[ranges[i].tensor].name + "' overlap");
    }
  }
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsModel SafetensorsModel::open_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  SafetensorsModel model;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    if (!fs::exists(dir / "model.safetensors")) {
      throw FormatError(model_dir + ": neither model.safetensors nor "
                        "model.safetensors.index.json is present");
    }
    model.files_.push_back(SafetensorsFile::open((dir / "model.safetensors").string()));
    for (const auto& t : model.files_[0].tensors()) model.by_name_.emplace(t.name, &t);
    return model;
  }

  std::ifstream in(index_path, std::ios::binary);
  const json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    throw FormatError(index_path.string() + ": invalid index (needs a 'weight_map' object)");
  }
  const json& weight_map = index["weight_map"];
  std::vector<std::string> shard_names;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      throw FormatError(index_path.string() + ": shard of '" + tensor + "' is not a string");
    }
    const std::string name = shard.get<std::string>();
    // Shard names are plain file names: an index must not point outside the model directory.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw FormatError(index_path.string() + ": shard name '" + name + "' is not a file name");
    }
    if (std::find(shard_names.begin(), shard_names.end(), name) == shard_names.end()) {
      shard_names.push_back(name);
    }
  }
  model.files_.reserve(shard_names.size());
  for (const auto& name : shard_names) {
    model.files_.push_back(SafetensorsFile::open((dir / name).string()));
    for (const auto& t : model.files_.back().tensors()) {
      if (!model.by_name_.emplace(t.name, &t).second) {
        throw FormatError(model_dir + ": tensor '" + t.name + "' appears in two shards");
      }
    }
  }
  for (const auto& [tensor, shard] : weight_map.items()) {
    const auto it = model.by_name_.find(tensor);
    const size_t file = std::find(shard_names.begin(), shard_names.end(),
                                  shard.get<std::string>()) - shard_names.begin();
    if (it == model.by_name_.end() || model.files_[file].find(tensor) != it->second) {
      throw FormatError(model_dir + ": tensor '" + tensor + "' is listed in the index under '" +
                        shard.get<std::string>() + "' but is not in that shard");
    }
  }
  return model;
}

const SafetensorsTensor* SafetensorsModel::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsModel::tensors() const {
  std::vector<const SafetensorsTensor*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

}  // namespace fp8serve
