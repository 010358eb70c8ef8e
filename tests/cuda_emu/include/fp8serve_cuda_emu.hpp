#pragma once
// The emulator as the CUDA backend sees it, reached through kernels/cuda/emulator_hook.hpp only:
// launches and shared memory (emu.hpp), the PTX functions of kernels/cuda/ptx.cuh (ptx.hpp), and
// why the cuBLASLt stand-in refused a call (cublaslt.hpp). This folder is on the include path of
// what links fp8serve_cuda_emu, and nothing else.
#include "tests/cuda_emu/cublaslt.hpp"
#include "tests/cuda_emu/emu.hpp"
#include "tests/cuda_emu/ptx.hpp"
