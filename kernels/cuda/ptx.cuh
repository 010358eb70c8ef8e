#pragma once
// Every inline PTX instruction of the CUDA kernels, each in one small named device function. nvcc
// builds the asm; the emulated build (FP8SERVE_CUDA_EMU) gets the same functions from the
// emulator (tests/cuda_emu/ptx.hpp), which implements each exactly: mma.sync as a
// warp-collective operation over the PTX ISA's fragment tables, cp.async deferred as on the
// hardware (poisoned destinations, per-thread groups, visibility only after a barrier), and the
// conversions with NVIDIA's own host code from cuda_fp8.hpp / cuda_bf16.hpp. So the emulator
// runs the code a GPU runs, not a portable twin of it.
//
// Conventions: a pair of 16-bit (or 8-bit) elements packs element 0 in the low half (little-endian
// memory order), as the kernels store them.
#include <cstdint>

#include "kernels/cuda/launch.hpp"

#if FP8SERVE_CUDA_EMU
#include "kernels/cuda/emulator_hook.hpp"  // the same functions, emulated (tests/cuda_emu/ptx.hpp)
// coverage: inline PTX (nvcc only), emulated by tests/cuda_emu/ptx.hpp: test_fast_paths_emu, test_attention_primitives_gpu_emu
#else
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define FP8SERVE_PTX __device__ __forceinline__

namespace fp8serve::cuda::ptx {

// d += A * B for one warp (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32): A 16x16 (row),
// B 16x8 (col), bf16 inputs, fp32 accumulators. Fragments, g = lane / 4, t = lane % 4:
//   a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..2t+1]   a[2] = A[g][2t+8..]   a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..2t+9][g]
//   d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
// Every lane of the warp executes it, from the same instruction (.aligned).
FP8SERVE_PTX void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same with f16 inputs (mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32): each register
// packs two fp16 values (element 0 low), same fragments; products are exact in fp32 (11-bit
// significands), the sum rounds in the tensor core's order.
FP8SERVE_PTX void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// An empty asm that "changes" x: the compiler keeps the value in a register from here on rather
// than recomputing it where it is used (in a loop: every trip). No instruction is generated.
FP8SERVE_PTX void keep_in_register(uint32_t& x) { asm volatile("" : "+r"(x)); }

// cp.async.cg.shared.global [smem], [gmem], 16, src_bytes: 16 bytes global -> shared, bypassing L1;
// the first src_bytes (0 or 16 here) are read, the rest zero-filled (src_bytes 0: gmem is not
// read). PRECOND: both addresses 16-byte aligned. Completed by cp_async_wait in the issuing
// thread; other threads see the bytes after a barrier that follows that wait.
FP8SERVE_PTX void cp_async_cg16(void* smem, const void* gmem, int src_bytes) {
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

// cp.async.commit_group: closes the group of this thread's copies issued since the last commit.
FP8SERVE_PTX void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// cp.async.wait_group N: waits until at most N of this thread's committed groups are in flight.
template <int N>
FP8SERVE_PTX void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// cvt.rn.f16x2.e4m3x2: two E4M3 codes -> two fp16 (exact: E4M3 is a subset of fp16; NaN becomes
// fp16's canonical 0x7fff). sm_89+; older GPUs get NVIDIA's software conversion.
FP8SERVE_PTX uint32_t cvt_f16x2_e4m3x2(uint16_t codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(codes));
  return r;
#else
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#endif
}

// cvt.f32.f16 of both halves of a pair: exact.
FP8SERVE_PTX void cvt_f32_f16x2(uint32_t pair, float& lo, float& hi) {
  asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;}"
      : "=f"(lo), "=f"(hi)
      : "r"(pair));
}

// cvt.rn.bf16x2.f32: two floats -> a bf16 pair, rounded to nearest even (NaN: canonical 0x7fff).
FP8SERVE_PTX uint32_t cvt_bf16x2_f32(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// cvt.rn.f16x2.f32: two floats -> an fp16 pair, rounded to nearest even (overflow: +-inf; NaN:
// canonical 0x7fff).
FP8SERVE_PTX uint32_t cvt_f16x2_f32(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// cvt.rn.satfinite.e4m3x2.f32: two floats -> two E4M3 codes, rounded to nearest even, saturated to
// +-448 (NaN: 0x7f). sm_89+; older GPUs get NVIDIA's software conversion.
FP8SERVE_PTX uint16_t cvt_e4m3x2_f32(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
#endif
}

}  // namespace fp8serve::cuda::ptx
#endif
