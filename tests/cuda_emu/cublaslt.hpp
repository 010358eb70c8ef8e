#pragma once
// The CPU emulator's cuBLASLt stand-in (cublaslt.cpp): what tests may ask it besides the cuBLASLt
// API itself. Emulated builds only.
#include <string>

namespace fp8serve::emu {

// Why the calling thread's last failed cuBLASLt call failed, in words ("" once a later
// cublasLtMatmul or cublasLtMatmulAlgoGetHeuristic succeeded): tests check that the expected
// rule refused a call, not merely that some rule did.
std::string cublaslt_last_failure();

}  // namespace fp8serve::emu
