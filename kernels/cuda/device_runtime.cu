#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/fp8.hpp"

#include <cuda_fp8.h>

#include <cstdio>
#include <utility>

namespace fp8serve::cuda {

int device_count() {
  int count = 0;
  // coverage: a machine without a driver or a device (the emulator always has its H200)
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return count;
}

std::string describe_device(int device) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  char details[96];
  snprintf(details, sizeof details, " (sm_%d%d, %.1f GiB, driver %d.%d)", prop.major, prop.minor,
           static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), driver / 1000,
           (driver % 1000) / 10);
  return prop.name + std::string(details);
}

double measure_copy_bandwidth(int device) {
  CUDA_CHECK(cudaSetDevice(device));
  const size_t bytes = size_t{1} << 30;
  DeviceBuffer src(bytes), dst(bytes);
  CUDA_CHECK(cudaMemset(src.data(), 1, bytes));
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 0.0f;
  for (int i = 0; i < 10; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    CUDA_CHECK(cudaMemcpy(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i == 0 || ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms > 0.0f ? 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) : 0.0;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::copy_from_host(const void* src, size_t bytes) {
  if (bytes > bytes_) throw std::out_of_range("DeviceBuffer::copy_from_host: more bytes than the buffer holds");
  CUDA_CHECK(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  if (bytes > bytes_) throw std::out_of_range("DeviceBuffer::copy_to_host: more bytes than the buffer holds");
  CUDA_CHECK(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost));
}

Stream::Stream() {
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  handle_ = stream;
}

Stream::~Stream() {
  if (handle_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

void Stream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_))); }

namespace {

constexpr int kEncodeThreads = 256;

__global__ void __launch_bounds__(kEncodeThreads) encode_fp8_kernel(const float* in, uint8_t* out, size_t n,
                                                                    bool use_cuda_intrinsic) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  out[i] = use_cuda_intrinsic ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3))
                              : fp8_e4m3_encode(in[i]);
}

}  // namespace

void encode_fp8_e4m3_on_device(const float* host_in, uint8_t* host_out, size_t n, bool use_cuda_intrinsic,
                               const Stream& stream) {
  if (n == 0) return;
  DeviceBuffer in(n * sizeof(float));
  DeviceBuffer out(n);
  const auto s = static_cast<cudaStream_t>(stream.handle());
  // Every copy on the kernel's stream: a plain cudaMemcpy runs on the legacy stream, which a
  // non-blocking stream does not wait for (its bytes may not have landed when the kernel reads).
  CUDA_CHECK(cudaMemcpyAsync(in.data(), host_in, n * sizeof(float), cudaMemcpyHostToDevice, s));
  const unsigned threads = kEncodeThreads;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  FP8SERVE_LAUNCH(encode_fp8_kernel, blocks, threads, 0, s, static_cast<const float*>(in.data()),
                  static_cast<uint8_t*>(out.data()), n, use_cuda_intrinsic);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaMemcpyAsync(host_out, out.data(), n, cudaMemcpyDeviceToHost, s));
  stream.synchronize();
}

}  // namespace fp8serve::cuda
