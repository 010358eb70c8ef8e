#pragma once
// The CUDA backend's device plumbing: device discovery, owned device buffers and streams.
// Plain C++ (no CUDA headers), so host code and tests include it without nvcc. The CUDA kernels
// themselves take a PagedKvView (kernels/paged_kv.hpp) by value and a Stream, like the CPU ones.
#include <cstddef>
#include <cstdint>
#include <string>

namespace fp8serve::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device (never throws), so
// `--device auto` and the [gpu] tests can fall back or skip cleanly.
int device_count();

// "NVIDIA H200 (sm_90, 139.8 GiB, driver 13.0)": for the start-up log.
std::string describe_device(int device);

// Device-to-device copy bandwidth in bytes/s (bytes read + bytes written per second) over a
// 1 GiB buffer, best of 10 copies: the ceiling the GPU benchmarks print their figures against.
double measure_copy_bandwidth(int device);

// Owns `bytes` of device memory; move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void copy_from_host(const void* src, size_t bytes);
  void copy_to_host(void* dst, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Owns a cudaStream_t (held as an opaque pointer to keep CUDA headers out of host code).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void* handle() const { return handle_; }
  void synchronize() const;

 private:
  void* handle_ = nullptr;
};

// Encodes n floats to FP8 E4M3 on the device, with CUDA's own conversion
// (__nv_cvt_float_to_fp8, SATFINITE) when `use_cuda_intrinsic`, else with fp8serve's codec
// compiled for the device. The [gpu] codec test checks both against the host codec.
void encode_fp8_e4m3_on_device(const float* host_in, uint8_t* host_out, size_t n,
                               bool use_cuda_intrinsic, const Stream& stream);

}  // namespace fp8serve::cuda
