#pragma once
// Device helpers shared by the CUDA kernels: 16-byte vectors of bf16, warp and block
// reductions, IEEE arithmetic that nvcc may not contract into FMAs, and the host-side checks
// that decide whether a kernel may use 16-byte accesses.
//
// bf16 is handled as its bits (std::uint16_t): widening is exact (a shift); narrowing a pair
// is the hardware conversion (one cvt.rn.bf16x2.f32, ptx.cuh), which rounds to nearest even like
// kernels/bf16.hpp's codec for every non-NaN value; single values use that codec.
#include <cstdint>
#include <cstring>

#include "kernels/bf16.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/ptx.cuh"
#include "kernels/fp8.hpp"

#define FP8SERVE_DEVICE __device__ __forceinline__

// Loop unrolling for nvcc; the emulator's host compiler runs the loops as they are (a host
// compiler warns about CUDA's pragma, and speed does not matter there).
#if defined(__CUDACC__)
#define FP8SERVE_UNROLL _Pragma("unroll")
#else
#define FP8SERVE_UNROLL
#endif

namespace fp8serve::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kVec8 = 8;  // bf16 elements in one 16-byte access

// ---- host side -------------------------------------------------------------------------------

inline int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool aligned_to(const void* p, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}
// True when a tensor of bf16 rows can be read in 16-byte vectors: base aligned, every row start
// and every column offset a multiple of 8 elements.
inline bool vec8_ok(const void* base, int64_t row_stride, int64_t columns) {
  return aligned_to(base, 16) && row_stride % kVec8 == 0 && columns % kVec8 == 0;
}

// ---- arithmetic ------------------------------------------------------------------------------

// Separately rounded IEEE operations: the host reference rounds each product (RoPE) and divides
// (FP8 quantization), so nvcc must neither fuse a multiply into an add nor use a fast reciprocal.
// (The emulated build's host operations round the same way: test_rope_gpu_emu and
// test_kv_write_gpu_emu compare bit for bit.)
FP8SERVE_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)  // coverage: nvcc's IEEE intrinsic, device code only
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FP8SERVE_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)  // coverage: nvcc's IEEE intrinsic, device code only
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FP8SERVE_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)  // coverage: nvcc's IEEE intrinsic, device code only
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
// One RoPE pair (x[i], x[i + half]) turned by (cos, sin) with the host reference's arithmetic
// (kernels/cpu/ops_rope.cpp): four separately rounded products, one subtraction, one addition.
FP8SERVE_DEVICE void rope_pair(float x0, float x1, float c, float s, float& r0, float& r1) {
  r0 = sub_rn(mul_rn(x0, c), mul_rn(x1, s));
  r1 = add_rn(mul_rn(x1, c), mul_rn(x0, s));
}
FP8SERVE_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)  // coverage: nvcc's IEEE intrinsic, device code only
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// ---- bf16 vectors ----------------------------------------------------------------------------

// Two bf16 in one 32-bit word, element 0 in the low half (little-endian memory order).
FP8SERVE_DEVICE void unpack_bf16x2(uint32_t word, float& lo, float& hi) {
  lo = fp8_bits_float(word << 16);
  hi = fp8_bits_float(word & 0xffff0000u);
}
FP8SERVE_DEVICE uint32_t pack_bf16x2(float lo, float hi) { return ptx::cvt_bf16x2_f32(lo, hi); }

// kVec consecutive bf16 to/from fp32: one 16-byte access for kVec = 8 (PRECOND: p 16-byte
// aligned), element by element for kVec = 1.
template <int kVec>
FP8SERVE_DEVICE void load_bf16(const std::uint16_t* p, float (&out)[kVec]) {
  if constexpr (kVec == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    unpack_bf16x2(v.x, out[0], out[1]);
    unpack_bf16x2(v.y, out[2], out[3]);
    unpack_bf16x2(v.z, out[4], out[5]);
    unpack_bf16x2(v.w, out[6], out[7]);
  } else {
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) out[i] = bf16_decode(p[i]);
  }
}

template <int kVec>
FP8SERVE_DEVICE void store_bf16(std::uint16_t* p, const float (&in)[kVec]) {
  if constexpr (kVec == 8) {
    uint4 v;
    v.x = pack_bf16x2(in[0], in[1]);
    v.y = pack_bf16x2(in[2], in[3]);
    v.z = pack_bf16x2(in[4], in[5]);
    v.w = pack_bf16x2(in[6], in[7]);
    *reinterpret_cast<uint4*>(p) = v;
  } else {
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) p[i] = bf16_encode(in[i]);
  }
}

// Raw copy of kVec bf16 (no conversion).
template <int kVec>
FP8SERVE_DEVICE void copy_bf16(std::uint16_t* dst, const std::uint16_t* src) {
  if constexpr (kVec == 8) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  } else {
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) dst[i] = src[i];
  }
}

// ---- reductions ------------------------------------------------------------------------------

struct SumOp {
  FP8SERVE_DEVICE float operator()(float a, float b) const { return a + b; }
};
// max that skips NaN (a comparison with NaN is false), as the host amax does.
struct MaxOp {
  FP8SERVE_DEVICE float operator()(float a, float b) const { return b > a ? b : a; }
};

// Reduces over aligned groups of `width` lanes (a power of two <= 32); every lane of the warp
// must call it, and every lane of a group gets the group's result. A fixed xor tree: the order
// of the additions never depends on the data or on the launch.
template <class Op>
FP8SERVE_DEVICE float warp_reduce(float v, Op op, int width = kWarpSize) {
  for (int offset = width / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

FP8SERVE_DEVICE unsigned long long warp_sum_u64(unsigned long long v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Reduces over the whole block and returns the result to every thread. PRECOND: blockDim.x is
// a multiple of 32 and every thread calls it; scratch is a __shared__ float[32].
template <class Op>
FP8SERVE_DEVICE float block_reduce(float v, Op op, float identity, float* scratch) {
  v = warp_reduce(v, op);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int num_warps = static_cast<int>(blockDim.x) / kWarpSize;
  // Every warp reduces the partials itself, so no second barrier is needed to broadcast.
  v = warp_reduce(lane < num_warps ? scratch[lane] : identity, op);
  __syncthreads();  // scratch may be reused after return
  return v;
}

FP8SERVE_DEVICE void raise_error(unsigned* errors, unsigned bit) {
  if (errors != nullptr) atomicOr(errors, bit);
}

}  // namespace fp8serve::cuda
