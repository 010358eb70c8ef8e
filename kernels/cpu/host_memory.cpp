#include "kernels/cpu/host_memory.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fp8serve::cpu {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kSmallAlignment = 64;
}  // namespace

void* allocate_host_memory(std::size_t bytes) {
  // Below a huge page, a plain cache-line-aligned block: padding small buffers to 2 MiB would
  // waste memory for nothing.
  const std::size_t alignment = bytes >= kHugePage ? kHugePage : kSmallAlignment;
  if (bytes > std::numeric_limits<std::size_t>::max() - alignment) throw std::bad_alloc();
  const std::size_t rounded = bytes == 0 ? alignment : (bytes + alignment - 1) / alignment * alignment;
  void* ptr = std::aligned_alloc(alignment, rounded);
  if (ptr == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where THP is off it fails harmlessly and the buffer keeps 4 KiB pages.
  if (alignment == kHugePage) (void)madvise(ptr, rounded, MADV_HUGEPAGE);
#endif
  std::memset(ptr, 0, rounded);  // first touch after the advice, so the pages come huge
  return ptr;
}

void free_host_memory(void* ptr) noexcept { std::free(ptr); }

}  // namespace fp8serve::cpu
