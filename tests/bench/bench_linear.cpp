// bench_linear: our linear (kernels/cpu/linear.hpp) with bf16 and FP8 weights, on the fp32-dot
// and the bf16-dot paths, next to the limits it chases and next to OpenBLAS, on SmolLM2-135M's
// shapes (hidden 576, intermediate 1536, 9 x 64 query heads, 3 KV heads, vocab 49152, 30 layers).
//
//   bench_linear [--threads N] [--quick]
//
// Prints, all measured in this run:
//   - memory read bandwidth (a streaming read of the same weight bytes, same thread count)
//   - fp32 FMA peak and vdpbf16ps peak (register-only, same thread count)
//   - batch-1 decode: every projection of the model once per token (weights far larger than
//     the LLC, as in a real decode step): GB/s of weight bytes vs the bandwidth, per weight
//     dtype and path
//   - batch-16 decode throughput vs batch 1
//   - prefill GEMMs (1000 tokens): GFLOP/s vs the peaks
//   - the error of the bf16 dot (x rounded to bf16) and of FP8 weights, against fp32
//   - OpenBLAS cblas_sgemm on fp32 copies of the weights (loaded with dlopen, so the build does
//     not need it), and whether it is batch invariant
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/fp8_quantize.hpp"
#include "machine_limits.hpp"

using namespace fp8serve;
using namespace fp8serve::cpu;

namespace {

struct Weight {
  int64_t in, out;
  std::vector<std::uint16_t> bf16;
  std::vector<std::uint8_t> fp8;  // per-channel, quantized from bf16
  std::vector<float> scales;
  std::vector<float> fp32;  // for OpenBLAS
};

Weight make_weight(int64_t out, int64_t in, std::uint32_t seed) {
  Weight w{in, out, std::vector<std::uint16_t>(static_cast<std::size_t>(in * out)), {}, {}, {}};
  std::uint32_t state = seed * 2654435761u + 1u;
  for (auto& v : w.bf16) {
    state = state * 1664525u + 1013904223u;
    v = float_to_bf16((static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f);
  }
  w.fp8.resize(w.bf16.size());
  w.scales.resize(static_cast<std::size_t>(out));
  std::vector<float> row(static_cast<std::size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) row[static_cast<std::size_t>(k)] = bf16_to_float(w.bf16[static_cast<std::size_t>(o * in + k)]);
    quantize_row_fp8(row.data(), in, w.fp8.data() + o * in, w.scales.data() + o);
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

  bool load() {
    for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
    if (!handle) return false;
    sgemm = reinterpret_cast<Sgemm>(dlsym(handle, "cblas_sgemm"));
    set_threads = reinterpret_cast<SetThreads>(dlsym(handle, "openblas_set_num_threads"));
    return sgemm != nullptr;
  }

  // y[tokens, out] = x[tokens, in] @ W^T
  void linear(const float* x, const Weight& w, float* y, int64_t tokens) const {
    sgemm(101, 111, 112, static_cast<int>(tokens), static_cast<int>(w.out), static_cast<int>(w.in),
          1.0f, x, static_cast<int>(w.in), w.fp32.data(), static_cast<int>(w.in), 0.0f, y,
          static_cast<int>(w.out));
  }
};

// One way of running a projection: the weights' storage and the path.
struct Variant {
  std::string name;
  WeightDtype dtype;
  LinearIsa isa;
  double bytes_per_weight() const { return dtype == WeightDtype::bf16 ? 2.0 : 1.0; }
};

void run_ours(const Variant& v, const Weight& w, const float* x, float* y, int64_t tokens,
              ThreadPool& pool, LinearWorkspace& workspace) {
  LinearParams p;
  p.x = x;
  if (v.dtype == WeightDtype::bf16) {
    p.weight = w.bf16.data();
  } else {
    p.weight = w.fp8.data();
    p.weight_dtype = WeightDtype::fp8_e4m3;
    p.weight_scales = w.scales.data();
  }
  p.y = y;
  p.num_tokens = tokens;
  p.in_features = w.in;
  p.out_features = w.out;
  linear_cpu(p, pool, workspace, v.isa);
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
  LinearWorkspace workspace;
  std::printf("bench_linear: %d threads, cpu features: %s, linear path: %s\n", threads,
              describe(cpu_features()).c_str(), linear_isa_name(LinearIsa::best));

  const double peak = bench::fma_peak(pool) / 1e9;
  const double bf16_peak = bench::dpbf16_peak(pool) / 1e9;

  // The fp32 dot on the widest ISA, and the bf16 dot where the CPU has it.
  const LinearIsa fp32_isa = linear_isa_supported(LinearIsa::avx512) ? LinearIsa::avx512
                             : linear_isa_supported(LinearIsa::avx2) ? LinearIsa::avx2
                                                                     : LinearIsa::scalar;
  std::vector<Variant> variants = {
      {std::string("bf16 W, fp32 dot (") + linear_isa_name(fp32_isa) + ")", WeightDtype::bf16, fp32_isa},
      {std::string("fp8 W,  fp32 dot (") + linear_isa_name(fp32_isa) + ")", WeightDtype::fp8_e4m3, fp32_isa}};
  if (linear_isa_supported(LinearIsa::avx512bf16)) {
    variants.push_back({"bf16 W, bf16 dot (avx512bf16)", WeightDtype::bf16, LinearIsa::avx512bf16});
    variants.push_back({"fp8 W,  bf16 dot (avx512bf16)", WeightDtype::fp8_e4m3, LinearIsa::avx512bf16});
  }

  OpenBlas blas;
  const bool have_blas = blas.load();
  if (have_blas && blas.set_threads) blas.set_threads(threads);
  std::printf("OpenBLAS: %s\n\n", have_blas ? "loaded (cblas_sgemm on fp32 copies of the weights)" : "not found");

  // SmolLM2-135M: per layer the fused qkv, o, the fused gate_up, down; then the (tied) LM head.
  const int64_t hidden = 576, inter = 1536, kv = 3 * 64, vocab = 49152;
  const int num_layers = quick ? 8 : 30;
  std::vector<Weight> weights;
  for (int l = 0; l < num_layers; ++l) {
    const std::uint32_t s = static_cast<std::uint32_t>(l) * 16u;
    weights.push_back(make_weight(hidden + 2 * kv, hidden, s + 1));
    weights.push_back(make_weight(hidden, hidden, s + 4));
    weights.push_back(make_weight(2 * inter, hidden, s + 5));
    weights.push_back(make_weight(hidden, inter, s + 7));
  }
  weights.push_back(make_weight(vocab, hidden, 999));
  double num_weights = 0.0, num_scales = 0.0;
  for (const Weight& w : weights) {
    num_weights += static_cast<double>(w.in * w.out);
    num_scales += static_cast<double>(w.out);
  }

  std::vector<float> x(static_cast<std::size_t>(1024 * inter));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) * 0.01f - 0.5f;
  std::vector<float> y(static_cast<std::size_t>(1024 * vocab));

  // One decode step touches every weight once, 270 MB (bf16) for the full model: far beyond the
  // LLC, so each matrix comes from DRAM. Each matrix is timed on its own, over several sweeps,
  // and its best time kept: on a shared machine a whole-sweep time would mostly measure the
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
  const double bf16_bytes = 2.0 * num_weights;
  const double bandwidth = bf16_bytes / std::min(t_plain, t_prefetch) / 1e9;
  std::printf(
      "measured: read bandwidth %.1f GB/s (the bf16 decode weights streamed: plain %.1f, with "
      "prefetch %.1f); fp32 FMA peak %.0f GFLOP/s; vdpbf16ps peak %.0f GFLOP/s\n\n",
      bandwidth, bf16_bytes / t_plain / 1e9, bf16_bytes / t_prefetch / 1e9, peak, bf16_peak);

  // --- decode: batch 1 and 16 -----------------------------------------------------------------
  std::printf("decode sweep: %d layers x 4 projections (qkv, o, gate_up, down) + LM head = %.1f M weights "
              "(bf16 %.1f MB, fp8 %.1f MB + %.2f MB of scales)\n",
              num_layers, num_weights / 1e6, bf16_bytes / 1e6, num_weights / 1e6, 4.0 * num_scales / 1e6);
  std::printf("  %-32s | %9s %8s %7s | %9s %9s\n", "", "b=1 ms", "GB/s", "%bw", "b=16 ms", "b=16/b=1");
  for (const Variant& v : variants) {
    const double bytes = v.bytes_per_weight() * num_weights + (v.dtype == WeightDtype::bf16 ? 0.0 : 4.0 * num_scales);
    const double t1 = sweep([&](const Weight& w) { run_ours(v, w, x.data(), y.data(), 1, pool, workspace); });
    const double t16 = sweep([&](const Weight& w) { run_ours(v, w, x.data(), y.data(), 16, pool, workspace); });
    std::printf("  %-32s | %9.2f %8.1f %6.1f%% | %9.2f %8.1fx\n", v.name.c_str(), t1 * 1e3, bytes / t1 / 1e9,
                100.0 * bytes / t1 / 1e9 / bandwidth, t16 * 1e3, 16.0 * t1 / t16);
    std::fflush(stdout);
  }
  if (have_blas) {
    for (Weight& w : weights) make_fp32(w);
    const double b1 = sweep([&](const Weight& w) { blas.linear(x.data(), w, y.data(), 1); });
    const double b16 = sweep([&](const Weight& w) { blas.linear(x.data(), w, y.data(), 16); });
    std::printf("  %-32s | %9.2f %8.1f %7s | %9.2f %8.1fx\n", "OpenBLAS (fp32 W)", b1 * 1e3,
                4.0 * num_weights / b1 / 1e9, "", b16 * 1e3, 16.0 * b1 / b16);
    for (Weight& w : weights) std::vector<float>().swap(w.fp32);
  }
  std::printf("  (%%bw: bytes of the weights as stored / time / measured bandwidth; target 85%%)\n");

  // --- prefill GEMMs --------------------------------------------------------------------------
  struct Gemm {
    const char* name;
    int64_t tokens, in, out;
  };
  const Gemm gemms[] = {{"gate_up 1000x576->3072", 1000, hidden, 2 * inter},
                        {"down    1000x1536->576", 1000, inter, hidden},
                        {"qkv     1000x576->960 ", 1000, hidden, hidden + 2 * kv},
                        {"o       1000x576->576 ", 1000, hidden, hidden}};
  // Timed in 125-token slices, each slice's best time over the repetitions, summed: a whole
  // 1000-token GEMM runs longer than a scheduler slice, and on a shared machine its time would
  // mostly measure the neighbours. Every variant gets the same slices.
  const int64_t slice = 125;
  auto sliced = [&](int64_t tokens, const std::function<void(int64_t, int64_t)>& fn) {
    double total = 0.0;
    for (int64_t t = 0; t < tokens; t += slice) {
      const int64_t n = std::min(slice, tokens - t);
      total += bench::best_time(quick ? 3 : 10, [&] { fn(t, n); });
    }
    return total;
  };
  std::printf("\nprefill GEMMs in 125-token slices, GFLOP/s (fp32 FMA peak %.0f, vdpbf16ps peak %.0f)\n", peak,
              bf16_peak);
  for (const Gemm& g : gemms) {
    Weight w = make_weight(g.out, g.in, 7);
    const double flops = 2.0 * static_cast<double>(g.tokens * g.in * g.out);
    std::printf("  %s", g.name);
    for (const Variant& v : variants) {
      const double t = sliced(g.tokens, [&](int64_t t0, int64_t n) {
        run_ours(v, w, x.data() + t0 * g.in, y.data() + t0 * g.out, n, pool, workspace);
      });
      std::printf("  %s %6.1f", v.name.substr(0, v.name.find(',')).c_str(), flops / t / 1e9);
    }
    if (have_blas) {
      make_fp32(w);
      const double b = sliced(g.tokens, [&](int64_t t0, int64_t n) {
        blas.linear(x.data() + t0 * g.in, w, y.data() + t0 * g.out, n);
      });
      std::printf("  OpenBLAS %6.1f", flops / b / 1e9);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("  (columns in the order of the decode table)\n");

  // What each rounding costs, on the down projection's shape: against bf16 weights, fp32 dot.
  {
    Weight w = make_weight(hidden, inter, 11);
    const Variant reference = variants[0];
    std::vector<float> ref(static_cast<std::size_t>(64 * hidden)), got(ref.size());
    run_ours(reference, w, x.data(), ref.data(), 64, pool, workspace);
    double sum_sq = 0.0;
    for (const float v : ref) sum_sq += static_cast<double>(v) * v;
    const double rms = std::sqrt(sum_sq / static_cast<double>(ref.size()));
    std::printf("\nerror against bf16 weights with the fp32 dot (64 x 1536 -> 576), relative to the outputs' rms:\n");
    for (std::size_t i = 1; i < variants.size(); ++i) {
      run_ours(variants[i], w, x.data(), got.data(), 64, pool, workspace);
      double max_err = 0.0, err_sq = 0.0;
      for (std::size_t j = 0; j < ref.size(); ++j) {
        const double d = std::fabs(static_cast<double>(got[j]) - ref[j]);
        max_err = std::max(max_err, d);
        err_sq += d * d;
      }
      std::printf("  %-32s  rms %.2e  max %.2e\n", variants[i].name.c_str(),
                  std::sqrt(err_sq / static_cast<double>(ref.size())) / rms, max_err / rms);
    }
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
      const Variant& best = variants.back();
      run_ours(best, w, x.data(), ours_full.data(), g.tokens, pool, workspace);
      int64_t blas_rows_differ = 0, ours_rows_differ = 0;
      const int64_t checked = 50;
      for (int64_t t = 0; t < checked; ++t) {
        const float* row = x.data() + t * g.in;
        blas.linear(row, w, alone.data(), 1);
        blas_rows_differ += std::memcmp(alone.data(), full.data() + t * g.out, alone.size() * 4) != 0;
        run_ours(best, w, row, alone.data(), 1, pool, workspace);
        ours_rows_differ += std::memcmp(alone.data(), ours_full.data() + t * g.out, alone.size() * 4) != 0;
      }
      std::printf("  %s  OpenBLAS: %2lld of %lld rows differ   ours (%s): %lld of %lld\n", g.name,
                  static_cast<long long>(blas_rows_differ), static_cast<long long>(checked), best.name.c_str(),
                  static_cast<long long>(ours_rows_differ), static_cast<long long>(checked));
    }
  }
  return 0;
}
