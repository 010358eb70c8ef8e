#pragma once
// The backend an engine runs on: `--device auto|cpu|cuda` resolved against this build and this
// machine, once, at start-up. auto picks CUDA when the build has the CUDA backend and a device
// is present, else the CPU; cuda without either is a ConfigError that says why.
#include <memory>
#include <string>

#include "kernels/backend.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace fp8serve {

struct Device {
  std::string kind;                       // "cpu" or "cuda"
  // Host threads: the CPU backend's; on CUDA a few for the host's share of a step (sampling).
  std::unique_ptr<cpu::ThreadPool> pool;
  std::unique_ptr<Backend> backend;
};

// `threads`: the CPU backend's threads (0 = all cores); ignored on CUDA.
Device make_device(const std::string& device, int threads);

// Whether this binary was built with the CUDA backend.
bool built_with_cuda();

}  // namespace fp8serve
