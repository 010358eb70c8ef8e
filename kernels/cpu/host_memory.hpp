#pragma once
// Host memory for the big buffers (the KV pool, weights): 2 MiB-aligned and, on Linux, marked
// for transparent huge pages before first touch. Decode attention visits the pool's blocks in
// table order, which is random in memory; with 4 KiB pages a 1 GiB pool per layer misses the
// TLB on almost every block (docs/cpu.md, "Huge pages").
#include <cstddef>
#include <limits>
#include <new>

namespace fp8serve::cpu {

// Zero-filled, 64-byte aligned at least; huge-page backed where the OS allows. Throws
// std::bad_alloc. Release with free_host_memory.
void* allocate_host_memory(std::size_t bytes);
void free_host_memory(void* ptr) noexcept;

// A std::allocator for containers that hold such buffers (benchmarks, tests).
template <class T>
struct HostMemoryAllocator {
  using value_type = T;
  HostMemoryAllocator() = default;
  template <class U>
  HostMemoryAllocator(const HostMemoryAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(allocate_host_memory(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t) noexcept { free_host_memory(p); }
  template <class U>
  bool operator==(const HostMemoryAllocator<U>&) const noexcept { return true; }
};

}  // namespace fp8serve::cpu
