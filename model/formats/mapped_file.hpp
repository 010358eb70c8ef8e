#pragma once
// A read-only memory mapping of a whole file (move-only). Weight files are hundreds of MiB to
// many GiB, so the loaders read them through the page cache instead of copying them in.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace fp8serve {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws FormatError naming the path when the file cannot be opened or mapped, or is empty.
  static MappedFile open(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp8serve
