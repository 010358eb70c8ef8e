#pragma once
// The emulator's kernels/cuda/ptx.cuh: the same named functions, implemented exactly.
// - mma_m16n8k16_bf16 and _f16 are warp-collective operations: all 32 lanes of the warp must reach the
//   same call (.aligned), or the kernel aborts naming the lines; D is computed from the 32 lanes'
//   fragments by the PTX ISA's tables, in the accumulation order chosen for the run
//   (set_mma_order, FP8SERVE_EMU_MMA_ORDER): a tensor core's order is implementation defined.
// - cp.async is deferred as on the hardware (warp_scheduler.cpp): at issue the copy is queued for
//   its thread and its destination poisoned (0xFF bytes); cp_async_wait<N> performs all but the N
//   newest committed groups of that thread; the landed bytes are visible to that thread only until
//   a __syncthreads, or a __syncwarp naming it, makes them visible to the others. Issuing into
//   bytes a copy still holds, writing into another thread's unpublished copy, an unaligned or
//   out-of-bounds address, or a thread that exits with copies in flight aborts.
// - The conversions are NVIDIA's own host code (cuda_fp8.hpp, cuda_fp16.hpp, cuda_bf16.hpp),
//   canonical NaN outputs included.
#include <cstdint>
#include <cstring>

#include "tests/cuda_emu/emu.hpp"

#define FP8SERVE_PTX inline

namespace fp8serve::emu::detail {

// One lane's operands of an mma: d is read (C) and then written (D).
struct MmaLane {
  float* d;
  const uint32_t* a;
  const uint32_t* b;
};
void mma_m16n8k16_bf16(const MmaLane& lane, Site site);
void mma_m16n8k16_f16(const MmaLane& lane, Site site);
void cp_async_issue(void* smem, const void* gmem, int src_bytes, Site site);
void cp_async_commit(Site site);
void cp_async_wait(int n, Site site);

}  // namespace fp8serve::emu::detail

namespace fp8serve::cuda::ptx {

#define FP8SERVE_EMU_PTX_SITE const char *file = __builtin_FILE(), unsigned line = __builtin_LINE()

inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                              FP8SERVE_EMU_PTX_SITE) {
  emu::detail::mma_m16n8k16_bf16({d, a, b}, {file, line});
}

inline void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                             FP8SERVE_EMU_PTX_SITE) {
  emu::detail::mma_m16n8k16_f16({d, a, b}, {file, line});
}

inline void keep_in_register(uint32_t&) {}  // a hint to nvcc's register allocation only

inline void cp_async_cg16(void* smem, const void* gmem, int src_bytes, FP8SERVE_EMU_PTX_SITE) {
  emu::detail::cp_async_issue(smem, gmem, src_bytes, {file, line});
}

inline void cp_async_commit(FP8SERVE_EMU_PTX_SITE) { emu::detail::cp_async_commit({file, line}); }

template <int N>
inline void cp_async_wait(FP8SERVE_EMU_PTX_SITE) {
  static_assert(N >= 0 && N <= 7, "cp.async.wait_group takes 0..7");
  emu::detail::cp_async_wait(N, {file, line});
}

#undef FP8SERVE_EMU_PTX_SITE

inline uint32_t cvt_f16x2_e4m3x2(uint16_t codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

inline void cvt_f32_f16x2(uint32_t pair, float& lo, float& hi) {
  __half_raw l, h;
  l.x = static_cast<unsigned short>(pair & 0xffffu);
  h.x = static_cast<unsigned short>(pair >> 16);
  lo = __half2float(__half(l));
  hi = __half2float(__half(h));
}

inline uint32_t cvt_bf16x2_f32(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &pair, sizeof bits);
  return bits;
}

inline uint32_t cvt_f16x2_f32(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  uint32_t bits;
  std::memcpy(&bits, &pair, sizeof bits);
  return bits;
}

inline uint16_t cvt_e4m3x2_f32(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace fp8serve::cuda::ptx
