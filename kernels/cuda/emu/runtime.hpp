#pragma once
// Inside the emulator: the emulated device's limits and what the launch path asks of the
// runtime-API subset (runtime.cpp). Not for kernels or tests.
#include <cuda_runtime.h>

#include <cstddef>

namespace fp8serve::emu::detail {

// An H100-like device (cudaGetDeviceProperties reports these; launches are checked against them).
constexpr int kMultiProcessors = 132;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kSharedPerBlock = 48 * 1024;         // static, and dynamic without the attribute
constexpr size_t kSharedPerBlockOptin = 227 * 1024;   // dynamic + static, with the attribute
constexpr size_t kSharedPerMultiprocessor = 228 * 1024;

// Sets the calling host thread's last error (what cudaGetLastError returns) unless `error` is
// cudaSuccess; returns `error`.
cudaError_t record_error(cudaError_t error);

// The launch error a GPU would give for this configuration, or cudaSuccess.
cudaError_t check_launch(const void* function, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream);

// Whether `pointer` is null or inside (or one past the end of) a cudaMalloc or cudaMallocHost
// allocation.
bool is_device_accessible(const void* pointer);

[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fp8serve::emu::detail
