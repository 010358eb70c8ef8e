#pragma once
// Creates the CUDA backend (kernels/cuda/cuda_backend.hpp) for code that must not see CUDA
// headers: the server, the engine, tests. Link fp8serve_cuda (a GPU) or fp8serve_cuda_emu (the
// CPU emulator) for its definition.
#include <memory>

#include "kernels/backend.hpp"

namespace fp8serve::cuda {

// Throws std::runtime_error when the device cannot be used (cuda::device_count() says whether
// there is one at all).
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace fp8serve::cuda
