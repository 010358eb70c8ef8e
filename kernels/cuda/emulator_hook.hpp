#pragma once
// The CUDA backend's one door to the CPU emulator (tests/cuda_emu: test infrastructure, never in
// the fp8serve binary). The emulated build - the fp8serve_cuda_emu target, which defines
// FP8SERVE_CUDA_EMU=1 and alone puts <fp8serve_cuda_emu.hpp> on the include path - gets the
// emulator's side of launch.hpp, ptx.cuh and linear_cublaslt.cpp here; nvcc's build gets nothing.
// No other product file includes an emulator header.
#if !defined(FP8SERVE_CUDA_EMU)
#define FP8SERVE_CUDA_EMU 0
#endif

#if FP8SERVE_CUDA_EMU
#include <fp8serve_cuda_emu.hpp>
#endif
