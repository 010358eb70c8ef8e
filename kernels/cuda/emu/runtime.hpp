#pragma once
// Inside the emulator: the emulated device's limits and what the launch path asks of the
// runtime-API subset (runtime.cpp). Not for kernels or tests.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

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

// cudaSuccess for a valid stream (null, legacy, per-thread, or created), else
// cudaErrorInvalidResourceHandle.
cudaError_t check_stream(cudaStream_t stream);

// Whether [pointer, pointer + bytes) lies inside one cudaMalloc or cudaMallocHost allocation
// (what a library stand-in may let device code read or write); true for bytes == 0.
bool is_device_range(const void* pointer, size_t bytes);

// Device work issued on `stream` by a library stand-in (the cuBLASLt stand-in, cublaslt.cpp), as
// a library's kernels are: an invalid stream gives cudaErrorInvalidResourceHandle (also the
// calling thread's last error) and `work` is dropped; on a stream being captured it becomes a
// graph node, run at every cudaGraphLaunch; otherwise it runs now (every stream is synchronous
// here). `work` must read and write device memory only when it runs.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work);

// CUDA graphs (graph.cpp). cudaErrorStreamCaptureUnsupported, invalidating every open capture,
// when a capture is open (the caller is a call that could synchronise); else cudaSuccess.
cudaError_t refuse_during_capture();

[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fp8serve::emu::detail
