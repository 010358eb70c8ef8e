#pragma once
// PLACEHOLDER for the emulator branch's launch header (cuemu): its nvcc side only, so the
// kernels of this branch compile before the emulator is merged. The merge replaces this file.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.hpp"

#define FP8SERVE_CUDA_EMU 0
#define FP8SERVE_CUDA_FAST_PATHS 1

namespace fp8serve::cuda {
template <class T>
using SharedType = T;
}  // namespace fp8serve::cuda

#define FP8SERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define FP8SERVE_SHARED(type, name) __shared__ ::fp8serve::cuda::SharedType<type> name
