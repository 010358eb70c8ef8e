#pragma once
// The two limits every CPU benchmark here is compared against, measured in the same run with the
// same threads as the figure next to it: how fast this machine streams memory, and how many fp32
// FLOP/s its FMA units give. Both are best-of-several: the best run is the least disturbed one on
// a shared machine. Header-only, for the bench executables.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 (_mm512_undefined_*)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/host_memory.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace fp8serve::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best time of `reps` runs after one warm-up.
inline double best_time(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    fn();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

namespace detail {

// Sums n floats with 4 independent chains; with `prefetch`, asks for the data 4 KiB ahead (with
// 4 KiB pages the hardware prefetcher stops at every page boundary).
template <bool kPrefetch>
__attribute__((target("avx2"))) inline float read_chunk(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    if constexpr (kPrefetch) {
      const auto ahead = reinterpret_cast<std::uintptr_t>(p + i) + 4096;
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T1);
    }
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float lanes[8];
  _mm256_storeu_ps(lanes, s);
  return lanes[0] + lanes[7];
}

template <int kChains>
__attribute__((target("avx512f"))) inline float fma_loop_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  float out = 0.0f;
  for (int c = 0; c < kChains; ++c) out += _mm512_reduce_add_ps(acc[c]);
  return out;
}

template <int kChains>
__attribute__((target("avx2,fma"))) inline float fma_loop_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc[0]);
  return lanes[0];
}

template <int kChains>
__attribute__((target("avx512f,avx512bf16"))) inline float dpbf16_loop(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // bf16 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a83));  // bf16 ~1e-3
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  float out = 0.0f;
  for (int c = 0; c < kChains; ++c) out += _mm512_reduce_add_ps(acc[c]);
  return out;
}

}  // namespace detail

// Reads `bytes` at p with every thread of the pool, each its own contiguous slice.
inline void stream_read(cpu::ThreadPool& pool, const void* p, int64_t bytes, bool prefetch) {
  const int64_t floats = bytes / 4;
  const int64_t parts = pool.num_threads();
  std::vector<float> sink(static_cast<std::size_t>(parts) * 16);
  pool.parallel_for(parts, [&](int64_t i) {
    const int64_t begin = floats * i / parts, end = floats * (i + 1) / parts;
    const float* chunk = static_cast<const float*>(p) + begin;
    sink[static_cast<std::size_t>(i) * 16] = prefetch ? detail::read_chunk<true>(chunk, end - begin)
                                                      : detail::read_chunk<false>(chunk, end - begin);
  });
  volatile float keep = sink[0];
  (void)keep;
}

// Streaming read bandwidth in bytes/s over a buffer of `bytes` (make it far larger than the
// last-level cache) in the memory the backends use (2 MiB pages where the kernel allows), the
// better of the plain and the prefetching read, best of `reps`.
inline double read_bandwidth(cpu::ThreadPool& pool, std::size_t bytes, int reps = 5) {
  void* buffer = cpu::allocate_host_memory(bytes);
  std::fill_n(static_cast<char*>(buffer), bytes, char{1});
  double best = 0.0;
  for (const bool prefetch : {false, true}) {
    const double t = best_time(reps, [&] {
      stream_read(pool, buffer, static_cast<int64_t>(bytes), prefetch);
    });
    best = std::max(best, static_cast<double>(bytes) / t);
  }
  cpu::free_host_memory(buffer);
  return best;
}

// fp32 FMA peak in FLOP/s with the widest vectors the CPU has: independent FMA chains in
// registers on every thread, short bursts (a long one would also measure the neighbours).
inline double fma_peak(cpu::ThreadPool& pool) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const bool avx512 = f.avx512f;
  if (!avx512 && !(f.avx2 && f.fma)) return 0.0;
  const int64_t iters = 100000;
  std::vector<float> sink(static_cast<std::size_t>(pool.num_threads()));
  const double t = best_time(200, [&] {
    pool.parallel_for(pool.num_threads(), [&](int64_t i) {
      sink[static_cast<std::size_t>(i)] =
          avx512 ? detail::fma_loop_avx512<12>(iters) : detail::fma_loop_avx2<12>(iters);
    });
  });
  const double lanes = avx512 ? 16.0 : 8.0;
  return 2.0 * lanes * 12.0 * static_cast<double>(iters) * pool.num_threads() / t;
}

// The AVX512-BF16 dot product's peak in FLOP/s (a vdpbf16ps is 32 multiply-adds), measured as
// fma_peak; 0 where the CPU lacks it.
inline double dpbf16_peak(cpu::ThreadPool& pool) {
  if (!cpu::cpu_features().avx512bf16) return 0.0;
  const int64_t iters = 100000;
  std::vector<float> sink(static_cast<std::size_t>(pool.num_threads()));
  const double t = best_time(200, [&] {
    pool.parallel_for(pool.num_threads(), [&](int64_t i) {
      sink[static_cast<std::size_t>(i)] = detail::dpbf16_loop<12>(iters);
    });
  });
  return 2.0 * 32.0 * 12.0 * static_cast<double>(iters) * pool.num_threads() / t;
}

}  // namespace fp8serve::bench
