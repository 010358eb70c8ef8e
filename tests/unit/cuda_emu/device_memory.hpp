#pragma once
// Device memory for the emulator's tests: cudaMalloc'd arrays and their copies back.
#include <vector>

#include "kernels/cuda/launch.hpp"

namespace fp8serve::test {

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

template <class T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> host(n);
  CUDA_CHECK(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

}  // namespace fp8serve::test
