#pragma once
// Inside the emulator: the emulated device's limits and what the launch path asks of the
// runtime-API subset (runtime.cpp). Not for kernels or tests.
#include <cuda_runtime.h>

#include "tests/cuda_emu/emu.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>

namespace fp8serve::emu::detail {

// An H200 (cudaGetDeviceProperties reports these; launches and occupancy are checked against them).
constexpr int kMultiProcessors = 132;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kSharedPerBlock = 48 * 1024;         // static, and dynamic without the attribute
constexpr size_t kSharedPerBlockOptin = 227 * 1024;   // dynamic + static, with the attribute
constexpr size_t kSharedPerMultiprocessor = 228 * 1024;
constexpr int kRegistersPerMultiprocessor = 64 * 1024;

// The compute capability presented (major * 10 + minor): 90 (sm_90, an H200) unless
// FP8SERVE_EMU_SM names another (80, 86, 89, 90, 100, 120), so tests can check what the code does
// on a device without sm_90's FP8 GEMM. Only the reported capability and cuBLASLt's FP8 rules
// change; the limits and the execution stay an H200's.
int emulated_sm();

// The CTAs of `function` one SM holds at this block size and dynamic shared memory (occupancy.cpp).
int max_active_ctas(const void* function, int block_size, size_t dynamic_shared);

// Sets the calling host thread's last error (what cudaGetLastError returns) unless `error` is
// cudaSuccess; returns `error`.
cudaError_t record_error(cudaError_t error);

// The launch error a GPU would give for this configuration, or cudaSuccess.
cudaError_t check_launch(const void* function, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream);

// Whether `pointer` is null or inside (or one past the end of) a cudaMalloc or cudaMallocHost
// allocation.
bool is_device_accessible(const void* pointer);
// Whether [pointer, pointer + bytes) lies inside one cudaMalloc allocation.
bool is_device_range(const void* pointer, size_t bytes);

// cudaSuccess for a valid stream (null, legacy, per-thread, or created), else
// cudaErrorInvalidResourceHandle.
cudaError_t check_stream(cudaStream_t stream);

// Streams (streams.cpp). Queues `work` on `stream`, to run when the host synchronises with it,
// after what CUDA orders it after, as a library's kernels are too (the cuBLASLt stand-in); on a
// stream being captured it becomes a graph node, run at every cudaGraphLaunch. An invalid stream
// gives cudaErrorInvalidResourceHandle (also the calling thread's last error) and `work` is
// dropped. `work` must read and write device memory only when it runs. *id (if given and queued)
// names the operation.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work, uint64_t* id = nullptr);
// Runs everything queued on `stream` so far (and what it depends on) / on every stream.
void complete_stream(cudaStream_t stream);
void complete_all();

// CUDA graphs (graph.cpp). cudaErrorStreamCaptureUnsupported, invalidating every open capture,
// when a capture is open (the caller is a call that could synchronise); else cudaSuccess.
cudaError_t refuse_during_capture();
// The same for a call on `stream` that a capture cannot record (a copy from pageable memory):
// cudaErrorStreamCaptureUnsupported, invalidating the capture, when `stream` is being captured.
cudaError_t refuse_on_capturing(cudaStream_t stream);

// Runs a grid now, on the calling thread (grid.cpp): what a queued launch does when it runs.
void run_grid(const KernelCall& call, dim3 grid, dim3 block, size_t shared_bytes);


[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace fp8serve::emu::detail
