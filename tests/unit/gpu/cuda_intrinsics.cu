// The kernel of cuda_intrinsics.hpp, for nvcc and the emulator.
#include "tests/unit/gpu/cuda_intrinsics.hpp"

#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/launch.hpp"

namespace fp8serve::cuda::intrinsics {
namespace {

__global__ void intrinsics_kernel(const uint32_t* a_in, const uint32_t* b_in, uint32_t* out, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t a = a_in[i], b = b_in[i];
  const unsigned long long wide_a = (static_cast<unsigned long long>(a) << 32) | b;
  const unsigned long long wide_b = (static_cast<unsigned long long>(b) << 32) | a;
  // Multiples of 0.25 within +-2^21 (exact in fp32), ties at .5 included.
  const float f = static_cast<float>(static_cast<int32_t>(a) / 256) / 4.0f;
  const unsigned long long high = __umul64hi(wide_a, wide_b);
  uint32_t* r = out + static_cast<size_t>(i) * kNumResults;
  r[kPopc] = static_cast<uint32_t>(__popc(a));
  r[kClz] = static_cast<uint32_t>(__clz(static_cast<int>(a)));
  r[kFfs] = static_cast<uint32_t>(__ffs(static_cast<int>(a)));
  r[kBrev] = __brev(a);
  r[kBytePerm] = __byte_perm(a, b, b & 0x7777u);
  r[kFunnelLeft] = __funnelshift_l(a, b, b);
  r[kFunnelRight] = __funnelshift_r(a, b, b);
  r[kUmulhi] = __umulhi(a, b);
  r[kMulhi] = static_cast<uint32_t>(__mulhi(static_cast<int>(a), static_cast<int>(b)));
  r[kUmul64hiLow] = static_cast<uint32_t>(high);
  r[kUmul64hiHigh] = static_cast<uint32_t>(high >> 32);
  r[kFloat2IntRn] = static_cast<uint32_t>(__float2int_rn(f));
  r[kFloat2IntRz] = static_cast<uint32_t>(__float2int_rz(f));
  r[kFloat2IntRd] = static_cast<uint32_t>(__float2int_rd(f));
  r[kFloat2IntRu] = static_cast<uint32_t>(__float2int_ru(f));
  r[kSaturate] = __float_as_uint(__saturatef(f / 1048576.0f));
  r[kMinInt] = static_cast<uint32_t>(min(static_cast<int>(a), static_cast<int>(b)));
  r[kMaxUnsigned] = max(a, b);
  r[kFloatBitsRoundTrip] = __float_as_uint(__uint_as_float(a));
  r[kPopcll] = static_cast<uint32_t>(__popcll(wide_a));
  r[kClzll] = static_cast<uint32_t>(__clzll(static_cast<long long>(wide_a)));
  r[kFfsll] = static_cast<uint32_t>(__ffsll(static_cast<long long>(wide_a)));
}

}  // namespace

std::vector<uint32_t> run(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  const unsigned n = static_cast<unsigned>(a.size());
  DeviceBuffer d_a(n * sizeof(uint32_t)), d_b(n * sizeof(uint32_t)), d_out(size_t{n} * kNumResults * sizeof(uint32_t));
  d_a.copy_from_host(a.data(), n * sizeof(uint32_t));
  d_b.copy_from_host(b.data(), n * sizeof(uint32_t));
  FP8SERVE_LAUNCH(intrinsics_kernel, (n + 127) / 128, 128, 0, nullptr, static_cast<const uint32_t*>(d_a.data()),
                  static_cast<const uint32_t*>(d_b.data()), static_cast<uint32_t*>(d_out.data()), n);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> out(size_t{n} * kNumResults);
  d_out.copy_to_host(out.data(), out.size() * sizeof(uint32_t));
  return out;
}

}  // namespace fp8serve::cuda::intrinsics
