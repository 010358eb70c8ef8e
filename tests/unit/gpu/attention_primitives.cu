// The kernels of attention_primitives.hpp.
#include "tests/unit/gpu/attention_primitives.hpp"

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/device_runtime.hpp"

namespace fp8serve::cuda::attn_test {
namespace {

using namespace fp8serve::cuda::attn;

__global__ void decode_fp8_kernel(uint32_t* out, bool bits) {
  const int word = static_cast<int>(threadIdx.x);  // 64 threads, codes 4 word .. 4 word + 3
  const uint32_t packed = static_cast<uint32_t>(4 * word) | static_cast<uint32_t>(4 * word + 1) << 8 |
                          static_cast<uint32_t>(4 * word + 2) << 16 | static_cast<uint32_t>(4 * word + 3) << 24;
  float x[4];
  if (bits) {
    fp8x4_to_float_bits(packed, x);
  } else {
    fp8x4_to_float_cvt(packed, x);
  }
  for (int i = 0; i < 4; ++i) out[4 * word + i] = __float_as_uint(x[i]);
}

__global__ void pack_bf16_kernel(const float* a, const float* b, uint32_t* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = pack_bf16x2(a[i], b[i]);
}

// PTX's m16n8k16 fragments (ptx.cuh) loaded from row-major A, B, C. fault: a lane's fragment
// index off by one (lane 5 loads its a[1] from row g + 9), to show that such a bug fails.
__global__ void pack_f16_kernel(const float* a, const float* b, uint32_t* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = ptx::cvt_f16x2_f32(a[i], b[i]);
}

__global__ void mma_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d, int fault, bool f16) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  const int a1_row = fault == 1 && lane == 5 ? g + 9 : g + 8;
  auto a_pair = [&](int row, int col) { return uint32_t{a[row * 16 + col]} | uint32_t{a[row * 16 + col + 1]} << 16; };
  auto b_pair = [&](int k, int col) { return uint32_t{b[k * 8 + col]} | uint32_t{b[(k + 1) * 8 + col]} << 16; };
  const uint32_t af[4] = {a_pair(g, 2 * t), a_pair(a1_row, 2 * t), a_pair(g, 2 * t + 8), a_pair(g + 8, 2 * t + 8)};
  const uint32_t bf[2] = {b_pair(2 * t, g), b_pair(2 * t + 8, g)};
  float df[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  if (f16) {
    ptx::mma_m16n8k16_f16(df, af, bf);
  } else {
    ptx::mma_m16n8k16_bf16(df, af, bf);
  }
  d[g * 8 + 2 * t] = df[0];
  d[g * 8 + 2 * t + 1] = df[1];
  d[(g + 8) * 8 + 2 * t] = df[2];
  d[(g + 8) * 8 + 2 * t + 1] = df[3];
}

__global__ void scan_kernel(const int* counts, int n, int* out) {
  FP8SERVE_SHARED(int[4], scratch);
  FP8SERVE_DYNAMIC_SHARED(int, prefix);
  block_exclusive_scan(n, 128, [&](int i) { return counts[i]; }, prefix, scratch);
  for (int i = static_cast<int>(threadIdx.x); i <= n; i += 128) out[i] = prefix[i];
}

template <class T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t n) {
  std::vector<T> host(n);
  buffer.copy_to_host(host.data(), n * sizeof(T));
  return host;
}

}  // namespace

std::array<uint32_t, 256> decode_fp8_codes(bool bit_trick) {
  DeviceBuffer out(256 * sizeof(uint32_t));
  FP8SERVE_LAUNCH(decode_fp8_kernel, dim3(1), dim3(64), 0, nullptr, static_cast<uint32_t*>(out.data()), bit_trick);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::array<uint32_t, 256> bits{};
  out.copy_to_host(bits.data(), sizeof bits);
  return bits;
}

namespace {

template <class Kernel>
std::vector<uint32_t> pack_pairs(Kernel kernel, const std::vector<float>& a, const std::vector<float>& b) {
  const int n = static_cast<int>(a.size());
  DeviceBuffer da(a.size() * sizeof(float)), db(b.size() * sizeof(float)), out(a.size() * sizeof(uint32_t));
  da.copy_from_host(a.data(), a.size() * sizeof(float));
  db.copy_from_host(b.data(), b.size() * sizeof(float));
  FP8SERVE_LAUNCH(kernel, dim3(static_cast<unsigned>((n + 127) / 128)), dim3(128), 0, nullptr,
                  static_cast<const float*>(da.data()), static_cast<const float*>(db.data()),
                  static_cast<uint32_t*>(out.data()), n);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  return download<uint32_t>(out, a.size());
}

}  // namespace

std::vector<uint32_t> pack_bf16_pairs(const std::vector<float>& a, const std::vector<float>& b) {
  return pack_pairs(pack_bf16_kernel, a, b);
}

std::vector<uint32_t> pack_f16_pairs(const std::vector<float>& a, const std::vector<float>& b) {
  return pack_pairs(pack_f16_kernel, a, b);
}

std::vector<float> mma_16816(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b,
                             const std::vector<float>& c, int fault, bool f16) {
  DeviceBuffer da(256 * 2), db(128 * 2), dc(128 * 4), dd(128 * 4);
  da.copy_from_host(a.data(), 256 * 2);
  db.copy_from_host(b.data(), 128 * 2);
  dc.copy_from_host(c.data(), 128 * 4);
  FP8SERVE_LAUNCH(mma_kernel, dim3(1), dim3(32), 0, nullptr, static_cast<const uint16_t*>(da.data()),
                  static_cast<const uint16_t*>(db.data()), static_cast<const float*>(dc.data()),
                  static_cast<float*>(dd.data()), fault, f16);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  return download<float>(dd, 128);
}

std::vector<int> block_scan(const std::vector<int>& counts) {
  const int n = static_cast<int>(counts.size());
  DeviceBuffer in(counts.size() * sizeof(int) + 4), out((counts.size() + 1) * sizeof(int));
  in.copy_from_host(counts.data(), counts.size() * sizeof(int));
  FP8SERVE_LAUNCH(scan_kernel, dim3(1), dim3(128), (counts.size() + 1) * sizeof(int), nullptr,
                  static_cast<const int*>(in.data()), n, static_cast<int*>(out.data()));
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  return download<int>(out, counts.size() + 1);
}

}  // namespace fp8serve::cuda::attn_test
