#pragma once
// The CUDA emulator's device functions that NVIDIA's headers declare for nvcc only: math
// intrinsics, bit operations, reinterpretations, cached loads, fences and atomics. Included by
// emu.hpp; CUDA's names and signatures, in the global namespace as under nvcc.
//
// The fast math intrinsics are computed exactly here (a GPU's __expf or rsqrtf is within a few
// ulp): tests compare with tolerances that hold on both. Atomics are std::atomic_ref operations,
// sequentially consistent (a GPU's are relaxed; fences are seq_cst here too), so they are real
// atomics between the worker threads that run different blocks.
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>

// Math without a host version in NVIDIA's headers (expf, exp2f, fmaxf, ... come from <cmath>).
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __log10f(float x) { return std::log10(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = std::sin(x);
  *c = std::cos(x);
}
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(x))); }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }

// CUDA's min and max: same-type overloads, as its headers give device code.
#define FP8SERVE_EMU_MIN_MAX(T)                        \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
FP8SERVE_EMU_MIN_MAX(int)
FP8SERVE_EMU_MIN_MAX(unsigned)
FP8SERVE_EMU_MIN_MAX(long)
FP8SERVE_EMU_MIN_MAX(unsigned long)
FP8SERVE_EMU_MIN_MAX(long long)
FP8SERVE_EMU_MIN_MAX(unsigned long long)
#undef FP8SERVE_EMU_MIN_MAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// Reinterpretations and bit operations.
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1;
}
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __umulhi(unsigned x, unsigned y) {
  return static_cast<unsigned>((static_cast<uint64_t>(x) * y) >> 32);
}
inline int __mulhi(int x, int y) { return static_cast<int>((static_cast<int64_t>(x) * y) >> 32); }
inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
  const uint64_t x_lo = x & 0xffffffffu, x_hi = x >> 32, y_lo = y & 0xffffffffu, y_hi = y >> 32;
  const uint64_t middle = (x_lo * y_lo >> 32) + (x_hi * y_lo & 0xffffffffu) + x_lo * y_hi;
  return x_hi * y_hi + (x_hi * y_lo >> 32) + (middle >> 32);
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y:x} (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((bytes >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>(((static_cast<uint64_t>(hi) << 32 | lo) << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>((static_cast<uint64_t>(hi) << 32 | lo) >> (shift & 31u));
}

// Loads and stores with cache hints: plain accesses.
template <class T>
T __ldg(const T* p) { return *p; }
template <class T>
T __ldcg(const T* p) { return *p; }
template <class T>
T __ldca(const T* p) { return *p; }
template <class T>
T __ldcs(const T* p) { return *p; }
template <class T>
T __ldlu(const T* p) { return *p; }
template <class T>
T __ldcv(const T* p) { return *p; }
template <class T>
void __stcg(T* p, T v) { *p = v; }
template <class T>
void __stcs(T* p, T v) { *p = v; }
template <class T>
void __stwb(T* p, T v) { *p = v; }
template <class T>
void __stwt(T* p, T v) { *p = v; }

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// Atomics: each returns the value before the operation, as CUDA's do.
namespace fp8serve::emu::detail {
template <class T, class Op>
T atomic_update(T* address, Op op) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (!ref.compare_exchange_weak(old, op(old))) {
  }
  return old;
}
}  // namespace fp8serve::emu::detail

// The overloads CUDA has, no more: a kernel that builds here builds with nvcc.
#define FP8SERVE_EMU_ATOMIC(T, NAME, BODY) \
  inline T NAME(T* a, T v) { return BODY; }
#define FP8SERVE_EMU_ATOMIC_BITS(T)                                            \
  FP8SERVE_EMU_ATOMIC(T, atomicAdd, std::atomic_ref<T>(*a).fetch_add(v))      \
  FP8SERVE_EMU_ATOMIC(T, atomicExch, std::atomic_ref<T>(*a).exchange(v))      \
  FP8SERVE_EMU_ATOMIC(T, atomicAnd, std::atomic_ref<T>(*a).fetch_and(v))      \
  FP8SERVE_EMU_ATOMIC(T, atomicOr, std::atomic_ref<T>(*a).fetch_or(v))        \
  FP8SERVE_EMU_ATOMIC(T, atomicXor, std::atomic_ref<T>(*a).fetch_xor(v))      \
  inline T atomicCAS(T* a, T compare, T v) {                                   \
    std::atomic_ref<T>(*a).compare_exchange_strong(compare, v);               \
    return compare; /* the old value: `compare` on success, else the current */ \
  }
#define FP8SERVE_EMU_ATOMIC_MIN_MAX(T)                                                                 \
  FP8SERVE_EMU_ATOMIC(T, atomicMax,                                                                    \
                      fp8serve::emu::detail::atomic_update(a, [v](T old) { return old < v ? v : old; })) \
  FP8SERVE_EMU_ATOMIC(T, atomicMin,                                                                    \
                      fp8serve::emu::detail::atomic_update(a, [v](T old) { return v < old ? v : old; }))
FP8SERVE_EMU_ATOMIC_BITS(int)
FP8SERVE_EMU_ATOMIC_BITS(unsigned)
FP8SERVE_EMU_ATOMIC_BITS(unsigned long long)
FP8SERVE_EMU_ATOMIC_MIN_MAX(int)
FP8SERVE_EMU_ATOMIC_MIN_MAX(unsigned)
FP8SERVE_EMU_ATOMIC_MIN_MAX(long long)
FP8SERVE_EMU_ATOMIC_MIN_MAX(unsigned long long)
FP8SERVE_EMU_ATOMIC(int, atomicSub, std::atomic_ref<int>(*a).fetch_sub(v))
FP8SERVE_EMU_ATOMIC(unsigned, atomicSub, std::atomic_ref<unsigned>(*a).fetch_sub(v))
FP8SERVE_EMU_ATOMIC(float, atomicExch, std::atomic_ref<float>(*a).exchange(v))
FP8SERVE_EMU_ATOMIC(float, atomicAdd, fp8serve::emu::detail::atomic_update(a, [v](float old) { return old + v; }))
FP8SERVE_EMU_ATOMIC(double, atomicAdd, fp8serve::emu::detail::atomic_update(a, [v](double old) { return old + v; }))
#undef FP8SERVE_EMU_ATOMIC_MIN_MAX
#undef FP8SERVE_EMU_ATOMIC_BITS
#undef FP8SERVE_EMU_ATOMIC
