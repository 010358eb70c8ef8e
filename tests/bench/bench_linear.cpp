// bench_linear: our bf16-weight linear (kernels/cpu/linear.hpp) next to the limits it chases and
// next to OpenBLAS, on SmolLM2-135M's shapes (hidden 576, intermediate 1536, 9 x 64 query heads,
// 3 KV heads, vocab 49152, 30 layers).
//
//   bench_linear [--threads N] [--quick]
//
// Prints, all measured in this run:
//   - memory read bandwidth (a streaming read of the same weight bytes, same thread count)
//   - FMA peak (register-only fp32 FMAs, widest ISA, same thread count)
//   - batch-1 decode: every projection of the model once per token (weights far larger than
//     the LLC, as in a real decode step): GB/s of weight bytes vs the bandwidth
//   - batch-16 decode throughput vs batch 1
//   - prefill GEMMs (1000 tokens): GFLOP/s vs the FMA peak
//   - the AVX512-BF16 dot product (vdpbf16ps) on the prefill shapes, and its error
//   - OpenBLAS cblas_sgemm on fp32 copies of the weights (loaded with dlopen, so the build does
//     not need it), and whether it is batch invariant
#include <dlfcn.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored \
    "-Wuninitialized"  // GCC bug 105593, see kernels/cpu/linear_avx512.cpp
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "machine_limits.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;

namespace {


struct Weight {
  int64_t in, out;
  std::vector<std::uint16_t> bf16;
  std::vector<float> fp32;  // for OpenBLAS
};

Weight make_weight(int64_t out, int64_t in, std::uint32_t seed) {
  Weight w{in, out, std::vector<std::uint16_t>(static_cast<std::size_t>(in * out)), {}};
  std::uint32_t state = seed * 2654435761u + 1u;
  for (auto& v : w.bf16) {
    state = state * 1664525u + 1013904223u;
    v = float_to_bf16((static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f);
  }
  return w;
}

void make_fp32(Weight& w) {
  w.fp32.resize(w.bf16.size());
  for (std::size_t i = 0; i < w.bf16.size(); ++i) w.fp32[i] = bf16_to_float(w.bf16[i]);
}

// OpenBLAS through dlopen: cblas_sgemm(RowMajor=101, NoTrans=111, Trans=112, ...).
struct OpenBlas {
  using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int,
                         float, float*, int);
  using SetThreads = void (*)(int);
  void* handle = nullptr;
  Sgemm sgemm = nullptr;
  SetThreads set_threads = nullptr;
  bool has_sbgemm = false;

  bool load() {
    for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
    if (!handle) return false;
    sgemm = reinterpret_cast<Sgemm>(dlsym(handle, "cblas_sgemm"));
    set_threads = reinterpret_cast<SetThreads>(dlsym(handle, "openblas_set_num_threads"));
    has_sbgemm = dlsym(handle, "cblas_sbgemm") != nullptr;
    return sgemm != nullptr;
  }

  // y[tokens, out] = x[tokens, in] @ W^T
  void linear(const float* x, const Weight& w, float* y, int64_t tokens) const {
    sgemm(101, 111, 112, static_cast<int>(tokens), static_cast<int>(w.out), static_cast<int>(w.in),
          1.0f, x, static_cast<int>(w.in), w.fp32.data(), static_cast<int>(w.in), 0.0f, y,
          static_cast<int>(w.out));
  }
};

// The AVX512-BF16 alternative, measured here only: vdpbf16ps multiplies bf16 pairs, so the
// activations are rounded to bf16 first (DESIGN.md keeps them fp32 on the CPU). 4 tokens x 6
// weight rows per tile; PRECOND: in % 32 == 0 (true for every SmolLM2 shape).
template <int R, int C>
__attribute__((target("avx512f,avx512bf16"))) void dpbf16_tile(const std::uint16_t* x, int64_t in,
                                                               const std::uint16_t* w, float* y,
                                                               int64_t y_stride) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < in; k += 32) {
    __m512bh wv[C];
    for (int c = 0; c < C; ++c)
      wv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + c * in + k));
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * in + k));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * y_stride + c] = _mm512_reduce_add_ps(acc[r][c]);
}

void dpbf16_linear(const Weight& w, const float* x, float* y, int64_t tokens, ThreadPool& pool) {
  std::vector<std::uint16_t> xb(static_cast<std::size_t>(tokens * w.in));
  for (std::size_t i = 0; i < xb.size(); ++i) xb[i] = float_to_bf16(x[i]);
  const int64_t full = tokens / 4 * 4;
  pool.parallel_for((w.out + 47) / 48, [&](int64_t item) {
    for (int64_t o = item * 48; o < std::min(w.out, item * 48 + 48); o += 6) {
      if (o + 6 > w.out) {  // edge rows: one at a time
        for (int64_t oo = o; oo < w.out; ++oo)
          for (int64_t t = 0; t < tokens; ++t)
            dpbf16_tile<1, 1>(xb.data() + t * w.in, w.in, w.bf16.data() + oo * w.in,
                              y + t * w.out + oo, w.out);
        continue;
      }
      for (int64_t t = 0; t < full; t += 4)
        dpbf16_tile<4, 6>(xb.data() + t * w.in, w.in, w.bf16.data() + o * w.in, y + t * w.out + o,
                          w.out);
      for (int64_t t = full; t < tokens; ++t)
        dpbf16_tile<1, 6>(xb.data() + t * w.in, w.in, w.bf16.data() + o * w.in, y + t * w.out + o,
                          w.out);
    }
  });
}

void run_ours(const Weight& w, const float* x, float* y, int64_t tokens, ThreadPool& pool) {
  LinearParams p;
  p.x = x;
  p.weight = w.bf16.data();
  p.y = y;
  p.num_tokens = tokens;
  p.in_features = w.in;
  p.out_features = w.out;
  linear_cpu(p, pool);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc)
      threads = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--quick")
      quick = true;
    else {
      std::fprintf(stderr, "usage: bench_linear [--threads N] [--quick]\n");
      return 2;
    }
  }
  ThreadPool pool(threads);
  const bool avx512 = linear_best_isa() == LinearIsa::avx512;
  std::printf("bench_linear: %d threads, cpu features: %s, linear path: %s\n", threads,
              describe(cpu_features()).c_str(), linear_isa_name(LinearIsa::best));

  const double peak = bench::fma_peak(pool) / 1e9;

  OpenBlas blas;
  const bool have_blas = blas.load();
  if (have_blas && blas.set_threads) blas.set_threads(threads);
  std::printf("OpenBLAS: %s; bf16 GEMM (cblas_sbgemm): %s\n\n",
              have_blas ? "loaded (cblas_sgemm on fp32 copies of the weights)" : "not found",
              blas.has_sbgemm ? "present" : "absent in this build");

  // SmolLM2-135M: per layer q, k, v, o, gate, up, down; then the (tied) LM head.
  const int64_t hidden = 576, inter = 1536, kv = 3 * 64, vocab = 49152;
  const int num_layers = quick ? 8 : 30;
  std::vector<Weight> weights;
  for (int l = 0; l < num_layers; ++l) {
    const std::uint32_t s = static_cast<std::uint32_t>(l) * 16u;
    weights.push_back(make_weight(hidden, hidden, s + 1));
    weights.push_back(make_weight(kv, hidden, s + 2));
    weights.push_back(make_weight(kv, hidden, s + 3));
    weights.push_back(make_weight(hidden, hidden, s + 4));
    weights.push_back(make_weight(inter, hidden, s + 5));
    weights.push_back(make_weight(inter, hidden, s + 6));
    weights.push_back(make_weight(hidden, inter, s + 7));
  }
  weights.push_back(make_weight(vocab, hidden, 999));
  double weight_bytes = 0.0;
  for (const Weight& w : weights) weight_bytes += 2.0 * static_cast<double>(w.in * w.out);

  std::vector<float> x(static_cast<std::size_t>(1024 * inter));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>((i * 37) % 101) * 0.01f - 0.5f;
  std::vector<float> y(static_cast<std::size_t>(1024 * vocab));

  // One decode step touches every weight once, 270 MB for the full model: far beyond the LLC,
  // so each matrix comes from DRAM. Each matrix is timed on its own, over several sweeps, and
  // its best time kept: on a shared machine a whole-sweep time would mostly measure the
  // neighbours. The bandwidth bound is measured the same way, reading the very same bytes.
  const int sweeps = quick ? 3 : 7;
  auto sweep = [&](const std::function<void(const Weight&)>& fn) {
    std::vector<double> best(weights.size(), 1e30);
    for (int rep = 0; rep <= sweeps; ++rep) {
      for (std::size_t i = 0; i < weights.size(); ++i) {
        const double t0 = bench::now_s();
        fn(weights[i]);
        if (rep > 0) best[i] = std::min(best[i], bench::now_s() - t0);  // rep 0 warms up
      }
    }
    double total = 0.0;
    for (double t : best) total += t;
    return total;
  };

  const double t_plain = sweep([&](const Weight& w) {
    bench::stream_read(pool, w.bf16.data(), static_cast<int64_t>(w.bf16.size() * 2), false);
  });
  const double t_prefetch = sweep([&](const Weight& w) {
    bench::stream_read(pool, w.bf16.data(), static_cast<int64_t>(w.bf16.size() * 2), true);
  });
  // The bound is the faster of the two reads: the bandwidth the memory can deliver to a loop.
  const double bandwidth = weight_bytes / std::min(t_plain, t_prefetch) / 1e9;
  std::printf(
      "measured: read bandwidth %.1f GB/s (the decode weights streamed: plain %.1f, with "
      "prefetch %.1f), fp32 FMA peak %.0f GFLOP/s (%s)\n\n",
      bandwidth, weight_bytes / t_plain / 1e9, weight_bytes / t_prefetch / 1e9, peak,
      avx512 ? "avx512" : "avx2");

  // --- decode: batch 1 and 16 -----------------------------------------------------------------
  std::printf(
      "decode sweep: %d layers x 7 projections + LM head = %.1f MB of bf16 weights per token\n",
      num_layers, weight_bytes / 1e6);
  const double t1 = sweep([&](const Weight& w) { run_ours(w, x.data(), y.data(), 1, pool); });
  const double gbs1 = weight_bytes / t1 / 1e9;
  std::printf(
      "  ours   batch 1 : %7.2f ms/token  %6.1f GB/s = %5.1f%% of measured bandwidth (target "
      "85%%)\n",
      t1 * 1e3, gbs1, 100.0 * gbs1 / bandwidth);
  const double t16 = sweep([&](const Weight& w) { run_ours(w, x.data(), y.data(), 16, pool); });
  std::printf("  ours   batch 16: %7.2f ms/step   %6.1f tokens/s = %.1fx batch 1 (target 8x)\n",
              t16 * 1e3, 16.0 / t16, (16.0 / t16) / (1.0 / t1));
  if (have_blas) {
    for (Weight& w : weights) make_fp32(w);
    const double b1 = sweep([&](const Weight& w) { blas.linear(x.data(), w, y.data(), 1); });
    std::printf("  BLAS   batch 1 : %7.2f ms/token  (reads fp32 weights: %.1f GB/s of fp32)\n",
                b1 * 1e3, 2.0 * weight_bytes / b1 / 1e9);
    const double b16 = sweep([&](const Weight& w) { blas.linear(x.data(), w, y.data(), 16); });
    std::printf("  BLAS   batch 16: %7.2f ms/step   %6.1f tokens/s\n", b16 * 1e3, 16.0 / b16);
    for (Weight& w : weights) std::vector<float>().swap(w.fp32);
  }

  // --- prefill GEMMs --------------------------------------------------------------------------
  struct Gemm {
    const char* name;
    int64_t tokens, in, out;
  };
  const Gemm gemms[] = {{"gate/up 1000x576->1536", 1000, hidden, inter},
                        {"down    1000x1536->576", 1000, inter, hidden},
                        {"q/o     1000x576->576 ", 1000, hidden, hidden},
                        {"k/v     1000x576->192 ", 1000, hidden, kv}};
  // Timed in 125-token slices, each slice's best time over the repetitions, summed: a whole
  // 1000-token GEMM runs longer than a scheduler slice, and on a shared machine its time would
  // mostly measure the neighbours. Both libraries get the same slices.
  const int64_t slice = 125;
  auto sliced = [&](int64_t tokens, const std::function<void(int64_t, int64_t)>& fn) {
    double total = 0.0;
    for (int64_t t = 0; t < tokens; t += slice) {
      const int64_t n = std::min(slice, tokens - t);
      total += bench::best_time(quick ? 3 : 10, [&] { fn(t, n); });
    }
    return total;
  };
  std::printf("\nprefill GEMMs in 125-token slices (GFLOP/s; measured peak %.0f)\n", peak);
  for (const Gemm& g : gemms) {
    Weight w = make_weight(g.out, g.in, 7);
    const double flops = 2.0 * static_cast<double>(g.tokens * g.in * g.out);
    const double ours = sliced(g.tokens, [&](int64_t t, int64_t n) {
      run_ours(w, x.data() + t * g.in, y.data() + t * g.out, n, pool);
    });
    std::printf("  %s  ours %6.1f (%4.1f%% of peak)", g.name, flops / ours / 1e9,
                100.0 * flops / ours / 1e9 / peak);
    if (have_blas) {
      make_fp32(w);
      const double b = sliced(g.tokens, [&](int64_t t, int64_t n) {
        blas.linear(x.data() + t * g.in, w, y.data() + t * g.out, n);
      });
      std::printf("   OpenBLAS %6.1f (%4.1f%%)", flops / b / 1e9, 100.0 * flops / b / 1e9 / peak);
    }
    if (cpu_features().avx512bf16) {
      const double d = sliced(g.tokens, [&](int64_t t, int64_t n) {
        dpbf16_linear(w, x.data() + t * g.in, y.data() + t * g.out, n, pool);
      });
      std::printf("   vdpbf16ps %6.1f", flops / d / 1e9);
    }
    std::printf("\n");
  }
  if (cpu_features().avx512bf16) {
    // What rounding the activations to bf16 costs in accuracy, on the down projection's shape.
    Weight w = make_weight(hidden, inter, 11);
    std::vector<float> ours(static_cast<std::size_t>(64 * hidden)), bf(ours.size());
    run_ours(w, x.data(), ours.data(), 64, pool);
    dpbf16_linear(w, x.data(), bf.data(), 64, pool);
    double max_err = 0.0, sum_sq = 0.0;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(ours[i] - bf[i])));
      sum_sq += static_cast<double>(ours[i]) * ours[i];
    }
    std::printf(
        "  vdpbf16ps vs fp32 activations (64 x 1536 -> 576): max |diff| = %.2e, "
        "%.2e of the outputs' rms\n",
        max_err, max_err / std::sqrt(sum_sq / ours.size()));
  }

  // --- OpenBLAS batch invariance ----------------------------------------------------------------
  if (have_blas) {
    std::printf("\nbatch invariance (row computed alone vs inside a batch, bitwise):\n");
    for (const Gemm& g : gemms) {
      Weight w = make_weight(g.out, g.in, 9);
      make_fp32(w);
      std::vector<float> full(static_cast<std::size_t>(g.tokens * g.out));
      std::vector<float> alone(static_cast<std::size_t>(g.out));
      std::vector<float> ours_full(full.size());
      blas.linear(x.data(), w, full.data(), g.tokens);
      run_ours(w, x.data(), ours_full.data(), g.tokens, pool);
      int64_t blas_rows_differ = 0, ours_rows_differ = 0;
      const int64_t checked = 50;
      for (int64_t t = 0; t < checked; ++t) {
        const float* row = x.data() + t * g.in;
        blas.linear(row, w, alone.data(), 1);
        blas_rows_differ +=
            std::memcmp(alone.data(), full.data() + t * g.out, alone.size() * 4) != 0;
        run_ours(w, row, alone.data(), 1, pool);
        ours_rows_differ +=
            std::memcmp(alone.data(), ours_full.data() + t * g.out, alone.size() * 4) != 0;
      }
      std::printf("  %s  OpenBLAS: %2lld of %lld rows differ   ours: %lld of %lld\n", g.name,
                  static_cast<long long>(blas_rows_differ), static_cast<long long>(checked),
                  static_cast<long long>(ours_rows_differ), static_cast<long long>(checked));
    }
  }
  return 0;
}
