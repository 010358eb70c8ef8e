#include "server/engine/device_select.hpp"

#include <algorithm>
#include <thread>

#include "config/config.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#if FP8SERVE_WITH_CUDA
#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/make_cuda_backend.hpp"
#endif

namespace fp8serve {

bool built_with_cuda() {
#if FP8SERVE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

int cuda_devices() {
#if FP8SERVE_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace

Device make_device(const std::string& device, int threads) {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw ConfigError("--device: expected auto, cpu or cuda, got '" + device + "'");
  }
  const bool want_cuda = device == "cuda" || (device == "auto" && cuda_devices() > 0);
  Device d;
  if (want_cuda) {
    if (!built_with_cuda()) {
      throw ConfigError("--device cuda: this binary was built without the CUDA backend (no nvcc at build "
                        "time); rebuild with the CUDA toolkit, or use --device cpu");
    }
    if (cuda_devices() == 0) {
      throw ConfigError("--device cuda: no CUDA device is visible (driver missing, or CUDA_VISIBLE_DEVICES "
                        "empty); use --device cpu");
    }
#if FP8SERVE_WITH_CUDA
    d.kind = "cuda";
    d.backend = cuda::make_cuda_backend(0);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    d.pool = std::make_unique<cpu::ThreadPool>(std::min(cores, 8));
    return d;
#endif
  }
  d.kind = "cpu";
  const int n = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  d.pool = std::make_unique<cpu::ThreadPool>(n);
  d.backend = std::make_unique<cpu::CpuBackend>(*d.pool);
  return d;
}

}  // namespace fp8serve
