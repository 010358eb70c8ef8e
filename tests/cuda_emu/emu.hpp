#pragma once
// fp8serve's CUDA emulator: the project's CUDA kernels (kernels/cuda/*.cu, unchanged) compiled by
// the host compiler and run on the CPU, so that CI executes the code a GPU executes - tensor-core
// MMA, cp.async, the hardware conversions, cuBLASLt, asynchronous streams - strictly enough that a
// green CI means the GPU build is right. Kernel files do not include this header: they include
// kernels/cuda/launch.hpp, whose emulator_hook.hpp includes it (through
// include/fp8serve_cuda_emu.hpp) when FP8SERVE_CUDA_EMU is 1.
//
// What it runs
// - NVIDIA's own headers (<cuda_runtime.h>, <cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h>) in host
//   mode: dim3, __half, __nv_bfloat16, __nv_fp8_e4m3 and their conversions are NVIDIA's host code.
// - The inline PTX of kernels/cuda/ptx.cuh, one named function per instruction, implemented
//   exactly (ptx.hpp): mma.sync as a warp collective from the PTX ISA's fragment tables, in a
//   chosen accumulation order (set_mma_order); cp.async deferred per thread with poisoned
//   destinations, visible to other threads only after a barrier (async_copy.cpp); the cvt
//   conversions as NVIDIA's host code, canonical NaNs included.
// - Every CUDA thread is a fiber with its own 256 KiB stack above a guard page (fiber.hpp). A
//   block runs on one OS thread, one fiber at a time: each runs until it waits at a
//   synchronisation point or exits. The blocks of a grid are shared among a few worker threads
//   (set_worker_threads), so atomics on global memory are real atomics between blocks.
// - Warps of 32 lanes (lane = linear thread index % 32, as on a GPU). __shfl_sync, _up, _down,
//   _xor (with CUDA's width segments, per the PTX shfl.sync definition), __ballot_sync, __any_sync,
//   __all_sync and __syncwarp wait for the lanes named in their mask only; __syncthreads and
//   __syncthreads_count/_and/_or wait for every thread of the block that has not exited.
// - The threads of a block run in a new seeded permutation every round between synchronisation
//   points, so code that reads another thread's write without a barrier, or assumes a warp runs
//   in lockstep, sees unwritten memory in some round. The seed (set_thread_order_seed,
//   FP8SERVE_EMU_SEED) is printed at the first launch and in every diagnostic: a failing order
//   repeats. The order of atomics between blocks run by different workers varies too
//   (set_worker_threads(1) fixes it).
// - Streams are asynchronous queues (streams.cpp): launches, copies and memsets run when the host
//   synchronises with them, in CUDA's order (the legacy stream's implicit synchronisation, events,
//   the documented synchronisation rules of each kind of copy: runtime.cpp). Stream capture and
//   graph launch run (graph.cpp): what is issued on a captured stream is recorded and replayed in
//   order, and a call that could synchronise during a capture fails as in
//   cudaStreamCaptureModeGlobal.
// - Static shared memory (FP8SERVE_SHARED) and dynamic shared memory (FP8SERVE_DYNAMIC_SHARED)
//   are allocated per block, exactly the size declared or launched with. Device functions without
//   a host version in NVIDIA's headers (math intrinsics, bit operations, atomics, __ldg, ...) are
//   in device_functions.hpp; the runtime-API subset is in runtime.cpp.
//
// Stricter than a GPU: each of these aborts with the kernel, the block and the thread named
// - a warp op whose mask names an exited lane, or a lane the block does not have (a partial last
//   warp); a lane calling with its own bit clear; a shuffle that reads a lane outside the mask; a
//   width that is not a power of 2 in [1, 32]; lanes of one mask left waiting at different warp
//   ops or with different masks (CUDA: undefined). CUDA tolerates exited lanes in the mask of a
//   vote or __syncwarp; the emulator does not: pass the mask of the lanes really there;
// - an mma.sync that not every lane of the warp reaches from the same line;
// - a cp.async to or from an unaligned or out-of-bounds address, into bytes another copy still
//   holds, or whose destination another thread writes before a barrier; a thread that exits with
//   copies in flight;
// - threads of a block at __syncthreads reached from different lines, or of different kinds;
// - a deadlock (e.g. half a warp at __syncthreads, half in a shuffle): every thread's state is
//   printed first;
// - a kernel pointer argument that is neither null nor inside a cudaMalloc / cudaMallocHost
//   allocation (a host pointer passed to a kernel faults on a GPU);
// - more than 48 KiB of static shared memory, more than 48 KiB of dynamic shared memory without
//   cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) (a launch error, as on a
//   GPU), or more than sharedMemPerBlockOptin in all.
// And it makes bugs show deterministically: shared memory (static and dynamic) and cudaMalloc /
// cudaMallocHost memory read as 0xFF bytes (NaN in fp32, bf16 and E4M3) until written, in every
// block, and so does the destination of a copy in flight; cudaMalloc allocates exactly the bytes
// asked for, so an ASan build reports a kernel's out-of-bounds access at its file and line;
// cudaMemcpy checks that its device ranges lie inside one allocation and that their direction
// matches the kind.
//
// What it cannot run: a compile or link error, or cudaErrorNotSupported, never a wrong answer
// - wmma, wgmma, TMA, PTX not in ptx.cuh (add it there, with its emulation);
// - cooperative groups, __reduce_*_sync, __match_*_sync, __nanosleep, clock(), textures and
//   surfaces, cudaMemcpyToSymbol, device-side launches, cudaLaunchKernel, graphs built node by
//   node and event nodes in captures (cudaErrorNotSupported), plain `__shared__` (use
//   FP8SERVE_SHARED), a launch that leaves out a kernel parameter with a default.
// __device__ and __constant__ variables are ordinary globals (initialised in their declaration);
// __launch_bounds__ is accepted and ignored (nvcc enforces it).
//
// What it cannot find
// - a race between two writes, or a read and a write, that land in one order in the seeded
//   interleaving and another on a GPU without reading unwritten memory (run compute-sanitizer's
//   racecheck on a GPU); concurrent kernels on different streams run one after the other;
// - __activemask is the warp's lanes that have not exited, not the lanes converged at the call;
// - floating-point detail: fast intrinsics (__expf, __fdividef, rsqrtf) are computed exactly,
//   and the host compiler does not contract a*b+c into an FMA as nvcc does: compare with
//   tolerances that hold on the GPU too;
// - speed: it tests logic, never performance (bench_cuda_emu measures what a thread resume costs).
//
// Limits: a block runs at most 1024 threads; a fiber's stack is 256 KiB (an overflow faults on the
// guard page); a thread spinning on a value another thread of its block will write hangs (no
// preemption); cudaMemGetInfo reports a fake total (set_device_memory_bytes, default 8 GiB) minus
// what cudaMalloc holds, and cudaMalloc fails beyond it.
#if !defined(FP8SERVE_CUDA_EMU) || !FP8SERVE_CUDA_EMU
#error "tests/cuda_emu/emu.hpp is for the emulated build (FP8SERVE_CUDA_EMU=1); include kernels/cuda/launch.hpp"
#endif
#if defined(__CUDACC__)
#error "the CUDA emulator is for the host compiler, not nvcc"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>  // before __noinline__ below: libstdc++'s shared_ptr_base.h spells that attribute
#include <tuple>
#include <type_traits>

// CUDA's keywords: NVIDIA's headers define __global__, __device__ and __host__ to nothing for a
// host compiler. Plain __shared__ would make one variable for every block at once: refuse it.
#undef __shared__
#define __shared__                                                                                 \
  static_assert(false, "the CUDA emulator needs shared memory declared with FP8SERVE_SHARED(type, " \
                       "name) or FP8SERVE_DYNAMIC_SHARED(type, name) (kernels/cuda/launch.hpp)");
#undef __launch_bounds__
#define __launch_bounds__(...)
#if !defined(__noinline__)
#define __noinline__ __attribute__((noinline))
#endif

namespace fp8serve::emu {

// Worker threads that run the blocks of a grid; 0 restores the default, min(4, max(2, cores)).
void set_worker_threads(unsigned count);
unsigned worker_threads();
// The device memory that cudaMemGetInfo reports and cudaMalloc may hold in all (default 8 GiB).
void set_device_memory_bytes(size_t bytes);
// Fiber resumes so far in this process (worker -> fiber -> worker; for measuring the emulator).
uint64_t fiber_switches();

// The order in which mma.sync sums a dot product of 16 exact bf16 products into the fp32
// accumulator: a tensor core's is implementation defined, so tolerances must hold for each.
//   sequential: ((c + p0) + p1) + ... + p15        reversed: ((p15 + p14) + ... + p0) + c
//   pairwise:   c + a balanced tree of p0..p15      wide: c + sum, rounded to fp32 once
// Default: FP8SERVE_EMU_MMA_ORDER (one of those names) if set, else sequential.
enum class MmaOrder : uint8_t { sequential, pairwise, reversed, wide };
void set_mma_order(MmaOrder order);
MmaOrder mma_order();
const char* mma_order_name(MmaOrder order);

// The seed of the order in which a block's threads run between synchronisation points (a
// permutation per round, derived from the seed, the launch's sequence number and the block).
// Default: FP8SERVE_EMU_SEED if set, else random; printed once, at the first launch, and in
// every diagnostic, so that a failing order can be run again.
void set_thread_order_seed(uint64_t seed);
uint64_t thread_order_seed();

namespace detail {

// The running fiber's indices. A block runs on one OS thread, so thread_local state is per block,
// and the scheduler sets thread_idx before it resumes each fiber.
inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local uint3 block_idx{0, 0, 0};
inline thread_local dim3 block_dim{1, 1, 1};
inline thread_local dim3 grid_dim{1, 1, 1};

enum class WarpOp : uint8_t {
  shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all, syncwarp, activemask,
  collective,  // a warp-collective instruction (mma.sync): every lane of the warp, one call site
};
enum class BarrierOp : uint8_t { sync, count, all, any };  // __syncthreads, _count, _and, _or

// A call site, for diagnostics and for checking that a block meets at one __syncthreads.
struct Site {
  const char* file;
  unsigned line;
};

// Called from a fiber: wait until every lane of `mask` is at a warp op, then return this lane's
// result (the shuffled value's bits, or the vote).
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int lane_arg, int width, Site site);
int barrier(BarrierOp op, int predicate, Site site);
void* static_shared(const void* key, size_t bytes, size_t align, Site site);
void* dynamic_shared();
[[noreturn]] void trap(Site site);

// A launch with the kernel's types erased: invoke(args) runs one CUDA thread's call.
struct KernelCall {
  const char* name;
  const void* function;  // the kernel's address: what cudaFuncSetAttribute names
  void (*invoke)(const void* args);
  const void* args;
};
// Checks the configuration as a GPU would (an error goes to cudaGetLastError) and queues the grid
// on `stream`, or records it when the stream is being captured (graph.cpp); `args` keeps the
// bound arguments alive until then.
void launch(const KernelCall& call, std::shared_ptr<const void> args, dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream);
// Stream capture (graph.cpp): whether `stream` is being captured; a recorded node runs at every
// cudaGraphLaunch of the graph, in order.
bool is_capturing(cudaStream_t stream);
void record_node(cudaStream_t stream, std::function<void()> node);
// Aborts unless `pointer` is null or inside a cudaMalloc / cudaMallocHost allocation.
void check_pointer_argument(const char* kernel, unsigned index, const void* pointer);

template <class T>
void check_argument(const char* kernel, unsigned index, const T& value) {
  if constexpr (std::is_pointer_v<T> && std::is_object_v<std::remove_pointer_t<T>>)
    check_pointer_argument(kernel, index, value);
}

template <class T>
uint64_t to_bits(T value) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp ops move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  return bits;
}

template <class T>
T from_bits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

template <class Kernel, class Args>
struct BoundKernel {
  Kernel kernel;
  Args args;
  // Each CUDA thread gets its own copy of the arguments, as every GPU thread reads the same values
  // and may change its copy.
  static void invoke(const void* self) {
    const auto& bound = *static_cast<const BoundKernel*>(self);
    std::apply(bound.kernel, bound.args);
  }
};

}  // namespace detail

// FP8SERVE_LAUNCH's emulated form: converts the arguments to the kernel's parameter types (as a
// launch does), checks pointer arguments, and queues the grid on the stream (streams.cpp: it runs
// when the host synchronises with the stream). Launch errors are reported as on a GPU, through
// cudaGetLastError().
template <class... Params, class... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "a kernel launch passes every parameter (no defaults)");
  using Bound = detail::BoundKernel<void (*)(Params...), std::tuple<Params...>>;
  auto bound = std::make_shared<const Bound>(Bound{kernel, std::tuple<Params...>(std::forward<Args>(args)...)});
  std::apply([&](const Params&... values) {
    unsigned index = 0;
    (detail::check_argument(name, index++, values), ...);
  }, bound->args);
  const void* args_address = bound.get();
  detail::launch({name, reinterpret_cast<const void*>(kernel), &Bound::invoke, args_address}, std::move(bound), grid,
                 block, shared_bytes, stream);
}

// FP8SERVE_SHARED's emulated form: the block's one copy of a static shared variable of type T,
// allocated (0xFF-filled) when the block's first thread reaches the declaration. `Site` is a
// lambda's type, unique to the declaration (and to each instantiation of a kernel template).
template <class T, class Site>
T& static_shared(Site, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "shared memory holds trivial types only (as nvcc requires)");
  static const char key = 0;
  return *static_cast<T*>(detail::static_shared(&key, sizeof(T), alignof(T), {file, line}));
}

// FP8SERVE_DYNAMIC_SHARED's emulated form: the block's dynamic shared memory, exactly the launch's
// shared_bytes, 0xFF-filled, 16-byte aligned.
inline void* dynamic_shared_memory() { return detail::dynamic_shared(); }

}  // namespace fp8serve::emu

// CUDA's built-in variables, read-only as on a GPU.
inline thread_local const uint3& threadIdx = fp8serve::emu::detail::thread_idx;
inline thread_local const uint3& blockIdx = fp8serve::emu::detail::block_idx;
inline thread_local const dim3& blockDim = fp8serve::emu::detail::block_dim;
inline thread_local const dim3& gridDim = fp8serve::emu::detail::grid_dim;
constexpr int warpSize = 32;

// NVIDIA's header declares the kernel-taking form of cudaFuncSetAttribute for nvcc only.
template <class T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// Warp shuffles and votes, block barriers, __trap: CUDA's names and arguments. The last two
// parameters are filled in by the compiler with the call site, for diagnostics.
#define FP8SERVE_EMU_SITE const char *file = __builtin_FILE(), unsigned line = __builtin_LINE()
#define FP8SERVE_EMU_WARP_OP(op, mask, bits, lane_arg, width) \
  fp8serve::emu::detail::warp_op(fp8serve::emu::detail::WarpOp::op, mask, bits, lane_arg, width, {file, line})
#define FP8SERVE_EMU_BARRIER(op, predicate) \
  fp8serve::emu::detail::barrier(fp8serve::emu::detail::BarrierOp::op, predicate, {file, line})

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, FP8SERVE_EMU_SITE) {
  return fp8serve::emu::detail::from_bits<T>(
      FP8SERVE_EMU_WARP_OP(shfl_idx, mask, fp8serve::emu::detail::to_bits(var), src_lane, width));
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, FP8SERVE_EMU_SITE) {
  return fp8serve::emu::detail::from_bits<T>(
      FP8SERVE_EMU_WARP_OP(shfl_up, mask, fp8serve::emu::detail::to_bits(var), static_cast<int>(delta), width));
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, FP8SERVE_EMU_SITE) {
  return fp8serve::emu::detail::from_bits<T>(
      FP8SERVE_EMU_WARP_OP(shfl_down, mask, fp8serve::emu::detail::to_bits(var), static_cast<int>(delta), width));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, FP8SERVE_EMU_SITE) {
  return fp8serve::emu::detail::from_bits<T>(
      FP8SERVE_EMU_WARP_OP(shfl_xor, mask, fp8serve::emu::detail::to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int predicate, FP8SERVE_EMU_SITE) {
  return static_cast<unsigned>(FP8SERVE_EMU_WARP_OP(ballot, mask, predicate != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int predicate, FP8SERVE_EMU_SITE) {
  return static_cast<int>(FP8SERVE_EMU_WARP_OP(any, mask, predicate != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int predicate, FP8SERVE_EMU_SITE) {
  return static_cast<int>(FP8SERVE_EMU_WARP_OP(all, mask, predicate != 0, 0, warpSize));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, FP8SERVE_EMU_SITE) {
  FP8SERVE_EMU_WARP_OP(syncwarp, mask, 0, 0, warpSize);
}
// The lanes of this warp that have not exited once every thread of the block has run as far as
// it can (a GPU gives the lanes converged at the call, which the emulator cannot know: a mask
// built from it inside divergent code names lanes that never come, and deadlocks).
inline unsigned __activemask(FP8SERVE_EMU_SITE) {
  return static_cast<unsigned>(FP8SERVE_EMU_WARP_OP(activemask, 0xffffffffu, 0, 0, warpSize));
}

inline void __syncthreads(FP8SERVE_EMU_SITE) { FP8SERVE_EMU_BARRIER(sync, 0); }
inline int __syncthreads_count(int predicate, FP8SERVE_EMU_SITE) { return FP8SERVE_EMU_BARRIER(count, predicate); }
inline int __syncthreads_and(int predicate, FP8SERVE_EMU_SITE) { return FP8SERVE_EMU_BARRIER(all, predicate); }
inline int __syncthreads_or(int predicate, FP8SERVE_EMU_SITE) { return FP8SERVE_EMU_BARRIER(any, predicate); }

[[noreturn]] inline void __trap(FP8SERVE_EMU_SITE) { fp8serve::emu::detail::trap({file, line}); }

#undef FP8SERVE_EMU_BARRIER
#undef FP8SERVE_EMU_WARP_OP
#undef FP8SERVE_EMU_SITE

#include "tests/cuda_emu/device_functions.hpp"
