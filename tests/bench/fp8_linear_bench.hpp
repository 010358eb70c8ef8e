#pragma once
// bench_forward's FP8-weight projection section: Backend::linear with FP8 E4M3 weights (one scale
// per row, and 128-input block scales) on Llama-3-8B's projection shapes, timed alone:
//   - 1, 8, 16 tokens (decode; on CUDA the FP8 GEMV, one pass over the weights): GB/s of weight
//     bytes, and that as a fraction of the copy bandwidth measured in the same run;
//   - 4096 tokens (prefill): TFLOP/s, and that as a fraction of the dense FP8 peak given on the
//     command line (H200 SXM's data sheet: 1979 TFLOP/s dense; not measurable without an FP8 GEMM
//     of our own). On CUDA this is the GEMV in groups of 16 tokens until the cuBLASLt FP8 GEMM
//     exists, so the figure says how far that path is from the goal (>= 60%).
// Rows (tests/gpu/summary.py parses them):
//   fp8-linear <proj> <scales> <tokens> <in> <out> <us> <GB/s> <%copy> <TFLOP/s> <%peak>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace fp8serve::bench {

struct Fp8LinearShape {
  const char* name;
  int64_t in, out;
};

// Seconds per Backend::linear call: one warm-up, then calls until ~0.2 s have passed, each on
// the next of `copies` copies of the weights (together larger than the GPU's L2, as a model's
// weights are: a decode step never finds a projection's codes in cache).
inline double time_linear(Backend& backend, LinearParams p, const std::vector<DeviceBuffer>& copies) {
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  backend.linear(p, Stream{});
  backend.synchronize(Stream{});
  std::size_t reps = 0;
  const double t0 = now();
  double elapsed = 0.0;
  do {
    for (int i = 0; i < 10; ++i, ++reps) {
      p.weight = copies[reps % copies.size()].data();
      backend.linear(p, Stream{});
    }
    backend.synchronize(Stream{});
    elapsed = now() - t0;
  } while (elapsed < 0.2);
  return elapsed / static_cast<double>(reps);
}

inline void bench_fp8_linear(Backend& backend, double copy_bytes_per_s, double fp8_peak_tflops, bool quick) {
  const std::vector<Fp8LinearShape> shapes = {
      {"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};
  const std::vector<int64_t> tokens = quick ? std::vector<int64_t>{1, 16, 4096} : std::vector<int64_t>{1, 8, 16, 4096};
  std::printf("\nFP8-weight projections (%s; dense FP8 peak %.0f TFLOP/s, data sheet)\n", backend.describe().c_str(),
              fp8_peak_tflops);
  std::printf("%-10s %-8s %-6s %6s %6s %6s %10s %8s %7s %9s %7s\n", "", "proj", "scales", "tokens", "in", "out", "us",
              "GB/s", "%copy", "TFLOP/s", "%peak");
  std::mt19937 rng(7);
  for (const Fp8LinearShape& s : shapes) {
    // Codes: random bytes without the two NaN codes; scales ~1/448 (values of the size of a
    // real checkpoint's: the speed does not depend on them).
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(s.in * s.out));
    for (std::size_t i = 0; i < codes.size(); i += 4) {
      const std::uint32_t r = rng();
      for (std::size_t j = 0; j < 4 && i + j < codes.size(); ++j) {
        const auto c = static_cast<std::uint8_t>(r >> (8 * j));
        codes[i + j] = (c & 0x7f) == 0x7f ? 0x7e : c;
      }
    }
    const int64_t max_tokens = tokens.back();
    std::vector<std::uint16_t> x(static_cast<std::size_t>(max_tokens * s.in), 0x3f80);  // bf16 1.0
    for (std::size_t i = 0; i < x.size(); i += 7) x[i] = 0xbf00;                         // some -0.5
    std::vector<DeviceBuffer> d_w;  // >= 256 MiB of codes in all
    for (std::size_t bytes = 0; bytes < (std::size_t{256} << 20); bytes += codes.size()) {
      d_w.emplace_back(backend, codes.size());
      backend.copy_to_device(d_w.back().data(), codes.data(), codes.size(), Stream{});
    }
    DeviceBuffer d_x(backend, x.size() * 2), d_y(backend, static_cast<std::size_t>(max_tokens * s.out) * 2);
    backend.copy_to_device(d_x.data(), x.data(), x.size() * 2, Stream{});
    for (const int64_t block : {int64_t{0}, int64_t{128}}) {
      const int64_t blocks = block ? (s.in + block - 1) / block : 1;
      const std::vector<float> scales(static_cast<std::size_t>(s.out * blocks), 1.0f / 448.0f);
      DeviceBuffer d_s(backend, scales.size() * 4);
      backend.copy_to_device(d_s.data(), scales.data(), scales.size() * 4, Stream{});
      for (const int64_t m : tokens) {
        LinearParams p;
        p.x = d_x.data();
        p.weight = d_w[0].data();
        p.weight_dtype = WeightDtype::fp8_e4m3;
        p.weight_scales = d_s.as<float>();
        p.weight_block_k = block;
        p.y = d_y.data();
        p.num_tokens = m;
        p.in_features = s.in;
        p.out_features = s.out;
        const double seconds = time_linear(backend, p, d_w);
        const double bytes = static_cast<double>(codes.size() + scales.size() * 4);
        const double tflops = 2.0 * static_cast<double>(m) * s.in * s.out / seconds / 1e12;
        std::printf("%-10s %-8s %-6s %6lld %6lld %6lld %10.2f %8.1f %6.1f%% %9.2f %6.2f%%\n", "fp8-linear", s.name,
                    block ? "blk128" : "row", static_cast<long long>(m), static_cast<long long>(s.in),
                    static_cast<long long>(s.out), seconds * 1e6, bytes / seconds / 1e9,
                    100.0 * bytes / seconds / copy_bytes_per_s, tflops, 100.0 * tflops / fp8_peak_tflops);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace fp8serve::bench
