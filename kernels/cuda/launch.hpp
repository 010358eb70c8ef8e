#pragma once
// The one header a CUDA kernel file (kernels/cuda/*.cu) includes. Every .cu builds two ways from
// the same source:
//   nvcc, for the GPU (fp8serve_cuda): FP8SERVE_CUDA_EMU is 0;
//   the host compiler, for the CPU emulator (fp8serve_cuda_emu, reached through emulator_hook.hpp;
//   tests/cuda_emu/emu.hpp says what it runs and what it cannot): FP8SERVE_CUDA_EMU is 1.
//
// Write kernels with these, never with their CUDA spellings:
//   FP8SERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, args...)
//       kernel<<<grid, block, shared_bytes, stream>>>(args...) under nvcc. A template
//       instantiation goes in parentheses: FP8SERVE_LAUNCH((attention<128, true>), ...). Every
//       kernel parameter is passed (no default arguments). Check with
//       CUDA_CHECK(cudaGetLastError()) after it, as after any launch.
//   FP8SERVE_SHARED(type, name);
//       a static shared variable: FP8SERVE_SHARED(float[32], partial_sums); (a type with a comma
//       needs an alias first). Plain __shared__ does not compile in the emulated build.
//   FP8SERVE_DYNAMIC_SHARED(type, name);
//       `type* name` pointing at the block's dynamic shared memory (16-byte aligned; the launch's
//       shared_bytes long). Once per kernel.
//   FP8SERVE_CUDA_FAST_PATHS
//       1 unless defined 0, in both builds. Inline PTX lives in ptx.cuh only, one named device
//       function per instruction, which the emulator implements (tests/cuda_emu/ptx.hpp): the
//       emulator runs the code the GPU runs. A portable twin of a fast path exists only where a GPU
//       build may choose it by measurement, behind `#if FP8SERVE_CUDA_FAST_PATHS` (today: the
//       bit-trick FP8 decode against cvt, attention_device.cuh); -DFP8SERVE_CUDA_FAST_PATHS=0
//       selects the twins, in either build, for the A/B. Hopper-only instructions (wgmma,
//       setmaxnreg) also need `__CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)` (nvcc
//       builds sm_80 and sm_90a).
//
// The file convention: kernels/cuda/*.cu hold kernels and host code that uses only the runtime
// API the emulator has (memory, copies, streams, events, device properties); both builds compile
// them (CUDA graphs included). kernels/cuda/*.cpp hold host code that calls a CUDA library
// (cuBLASLt): nvcc's build links the real library, the emulated build the emulator's stand-in
// (tests/cuda_emu/cublaslt.cpp). kernels/cuda/README.md says how to add a kernel and its tests.
#include "kernels/cuda/emulator_hook.hpp"  // the emulator's CUDA when FP8SERVE_CUDA_EMU is 1

#if !FP8SERVE_CUDA_EMU && defined(__CUDACC__)
#include <cuda_runtime.h>
#elif !FP8SERVE_CUDA_EMU
#error "kernels/cuda/launch.hpp: compile with nvcc, or with -DFP8SERVE_CUDA_EMU=1 against the CPU emulator"
#endif

#include "kernels/cuda/cuda_check.hpp"

#if !defined(FP8SERVE_CUDA_FAST_PATHS)
#define FP8SERVE_CUDA_FAST_PATHS 1
#endif

namespace fp8serve::cuda {
template <class T>
using SharedType = T;  // lets FP8SERVE_SHARED take an array type: SharedType<float[32]> name
}  // namespace fp8serve::cuda

#if FP8SERVE_CUDA_EMU
#define FP8SERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ::fp8serve::emu::launch(#kernel, kernel, grid, block, shared_bytes, stream __VA_OPT__(, ) __VA_ARGS__)
#define FP8SERVE_SHARED(type, name) \
  ::fp8serve::cuda::SharedType<type>& name = ::fp8serve::emu::static_shared<type>([] {})
#define FP8SERVE_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::fp8serve::emu::dynamic_shared_memory())
#else
#define FP8SERVE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define FP8SERVE_SHARED(type, name) __shared__ ::fp8serve::cuda::SharedType<type> name
#define FP8SERVE_DYNAMIC_SHARED(type, name)                                     \
  extern __shared__ __align__(16) unsigned char fp8serve_dynamic_shared_[]; \
  type* name = reinterpret_cast<type*>(fp8serve_dynamic_shared_)
#endif
