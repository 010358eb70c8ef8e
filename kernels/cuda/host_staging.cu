// Pinned host staging: see host_staging.hpp.
#include "kernels/cuda/host_staging.hpp"

#include <cstring>

#include "kernels/cuda/launch.hpp"

namespace fp8serve::cuda {

namespace {
constexpr std::size_t kInitialBytes = std::size_t{1} << 20;
constexpr std::size_t kAlign = 16;
}  // namespace

HostStaging::~HostStaging() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

void* HostStaging::take(std::size_t bytes) {
  const std::size_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  if (data_ == nullptr || start + bytes > capacity_) return nullptr;
  used_ = start + bytes;
  return static_cast<unsigned char*>(data_) + start;
}

void HostStaging::reserve(std::size_t bytes) {
  if (bytes <= capacity_) return;
  std::size_t capacity = capacity_ ? capacity_ : kInitialBytes;
  while (capacity < bytes) capacity *= 2;
  void* data = nullptr;
  CUDA_CHECK(cudaMallocHost(&data, capacity));
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = data;
  capacity_ = capacity;
  used_ = 0;
}

void HostStaging::finish() {
  for (const PendingCopy& copy : pending_) std::memcpy(copy.dst, copy.staged, copy.bytes);
  pending_.clear();
  used_ = 0;
}

}  // namespace fp8serve::cuda
