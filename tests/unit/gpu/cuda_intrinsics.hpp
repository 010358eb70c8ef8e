#pragma once
// Device intrinsics with exact results (bit operations, integer high products, conversions,
// saturation, min/max, reinterpretations), computed on the device for pairs of 32-bit inputs:
// nvcc's build runs them on a GPU, the emulator's on its own device_functions.hpp. The test
// (test_cuda_intrinsics_gpu.cpp) compares both with plain host loops.
#include <cstdint>
#include <vector>

namespace fp8serve::cuda::intrinsics {

// Results per input pair (a[i], b[i]), in this order.
enum Result : int {
  kPopc, kClz, kFfs, kBrev, kBytePerm, kFunnelLeft, kFunnelRight, kUmulhi, kMulhi, kUmul64hiLow, kUmul64hiHigh,
  kFloat2IntRn, kFloat2IntRz, kFloat2IntRd, kFloat2IntRu, kSaturate, kMinInt, kMaxUnsigned, kFloatBitsRoundTrip,
  kPopcll, kClzll, kFfsll, kNumResults
};

// out[i * kNumResults + r]; the float inputs of the conversions are a[i] reinterpreted, scaled
// into the int range (see the test).
std::vector<uint32_t> run(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b);

}  // namespace fp8serve::cuda::intrinsics
