#pragma once
// CUDA_CHECK: every CUDA API call goes through it; a failure throws with the file, the line,
// the call and CUDA's own words, so a broken device is reported, not ignored.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fp8serve::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " +
                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace fp8serve::cuda

#define CUDA_CHECK(call)                                                              \
  do {                                                                                \
    const cudaError_t fp8serve_cuda_err_ = (call);                                    \
    if (fp8serve_cuda_err_ != cudaSuccess)                                            \
      ::fp8serve::cuda::throw_cuda_error(fp8serve_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
