// [gpu] The projections: the CUDA backend's linear (linear_cublaslt.cpp on cuBLASLt - the real
// library on a GPU, the emulator's cuBLASLt stand-in in CI - for bf16 weights), against
// the CPU op (linear_cpu) on the same bf16 x widened to fp32 and the same bf16 weights:
// Llama-3-8B's qkv / gate_up / down (GPU), SmolLM2 and Qwen2-0.5B shapes with the QKV bias
// (emulator too), the LM head's fp32 logits, row strides on both sides, 1 to 300 tokens; FP8
// weights (one scale per row, or per row and block of 64 or 128 inputs, the project's quantizer)
// on the portable GEMM, which the backend runs for them, against the CPU op on the same codes and
// scales; and the cuBLASLt plan cache, which stays within its bound as token counts vary.
//
// Tolerance, per element: the two fp32 dot products differ only in summation order, each within
// (K - 1) u sum|x w| of the exact value (u = 2^-24; the standard bound), so they differ by at
// most 2 K u sum|x w|; the bias adds one rounding of |y|. A bf16 y then adds half a bf16 ulp:
//   |y_gpu - y_cpu| <= 2^-8 |y_cpu| + 2.1 K u (sum|x w| + |bias|)      (fp32 y: no 2^-8 term)
// cuBLASLt's tensor cores accumulate in fp32 but may round their partial sums differently
// (split-K, truncating alignment), so its sum term gets a factor 4 (the emulator's stand-in and
// the portable GEMM sum in k order: no factor there).
// The bound is rarely approached (real errors are ~sqrt(K) u): a wrong transpose, stride or
// tile edge shows up as errors of the order of |y| itself.
#include <cmath>

#include "cuda_test_util.hpp"
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
#include "kernels/cuda/launch.hpp"  // fp8serve::emu::set_device_memory_bytes
#endif
#include "kernels/cpu/linear.hpp"
#include "kernels/cuda/linear_cublaslt.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/fp8_quantize.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

struct LinearCase {
  int64_t tokens, in, out;
  bool bias = false;
  bool y_fp32 = false;
  int64_t x_pad = 0;  // x_stride = in + x_pad
  int64_t y_pad = 0;  // y_stride = out + y_pad
  int64_t fp8_block = -1;  // FP8 weights: 0 one scale per row, > 0 per block of that many inputs; -1 bf16
};

// W quantized to FP8 as the loader does (per row, or per block of each row), and its dequantized
// values for the error bound.
struct Fp8Weights {
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> dequantized;
};
Fp8Weights quantize(const std::vector<std::uint16_t>& w, int64_t out, int64_t in, int64_t block) {
  const int64_t bk = block > 0 ? block : in, blocks = weight_num_k_blocks(in, block);
  Fp8Weights q;
  q.codes.resize(static_cast<std::size_t>(out * in));
  q.scales.resize(static_cast<std::size_t>(out * blocks));
  q.dequantized.resize(q.codes.size());
  const std::vector<float> wf = widen(w);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * bk, n = std::min(bk, in - k0);
      const std::size_t at = static_cast<std::size_t>(o * in + k0);
      float& scale = q.scales[static_cast<std::size_t>(o * blocks + b)];
      quantize_row_fp8(wf.data() + at, n, q.codes.data() + at, &scale);
      for (int64_t k = 0; k < n; ++k) q.dequantized[at + static_cast<std::size_t>(k)] = fp8_e4m3_decode(q.codes[at + static_cast<std::size_t>(k)]) * scale;
    }
  }
  return q;
}

// backend: CudaBackend::linear (cuBLASLt for bf16 weights, the portable GEMM for FP8 ones);
// cublaslt: a CublasLtLinear of its own (the plan-cache test's).
enum class Path { backend, cublaslt };

void check_linear(Backend& gpu, const LinearCase& c, Path path, std::uint32_t seed,
                  cuda::CublasLtLinear* own_cublaslt = nullptr) {
  const bool fp8 = c.fp8_block >= 0;
  const bool real_cublas = !kEmulated && !fp8;
  INFO((path == Path::cublaslt ? "CublasLtLinear " : "backend linear ")
       << c.tokens << " x " << c.in << " -> "
                                                                      << c.out << (c.bias ? " +bias" : "")
                                                                      << (c.y_fp32 ? " fp32 y" : "")
                                                                      << (fp8 ? " fp8 block " : "")
                                                                      << (fp8 ? std::to_string(c.fp8_block) : ""));
  const int64_t x_stride = c.in + c.x_pad, y_stride = c.out + c.y_pad;
  const std::vector<std::uint16_t> x = random_bf16(static_cast<std::size_t>(c.tokens * x_stride), seed, 1.0f);
  const std::vector<std::uint16_t> w =
      random_bf16(static_cast<std::size_t>(c.out * c.in), seed + 1, 1.0f / std::sqrt(static_cast<float>(c.in)));
  const std::vector<std::uint16_t> bias = random_bf16(static_cast<std::size_t>(c.out), seed + 2, 0.5f);
  const std::size_t y_elems = static_cast<std::size_t>(c.tokens * y_stride);
  const std::size_t y_bytes = y_elems * (c.y_fp32 ? 4 : 2);
  const std::vector<std::uint8_t> y_init(y_bytes, 0x5a);

  const Fp8Weights q = fp8 ? quantize(w, c.out, c.in, c.fp8_block) : Fp8Weights{};
  DeviceBuffer d_x = to_device(gpu, x), d_w = fp8 ? to_device(gpu, q.codes) : to_device(gpu, w);
  DeviceBuffer d_b = to_device(gpu, bias), d_s = fp8 ? to_device(gpu, q.scales) : DeviceBuffer();
  DeviceBuffer d_y = to_device(gpu, y_init);
  LinearParams p;
  p.x = d_x.data();
  p.weight = d_w.data();
  if (fp8) {
    p.weight_dtype = WeightDtype::fp8_e4m3;
    p.weight_scales = d_s.as<float>();
    p.weight_block_k = c.fp8_block;
  }
  p.bias = c.bias ? d_b.as<std::uint16_t>() : nullptr;
  p.y = d_y.data();
  p.num_tokens = c.tokens;
  p.in_features = c.in;
  p.out_features = c.out;
  p.x_stride = x_stride;
  p.y_stride = y_stride;
  p.y_fp32 = c.y_fp32;
  if (path != Path::backend) {
    gpu.synchronize(Stream{});  // the uploads ran on the backend's stream; the launch uses it too
    own_cublaslt->run(p, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  } else {
    gpu.linear(p, Stream{});
  }
  const std::vector<std::uint8_t> got = to_host<std::uint8_t>(gpu, d_y, y_bytes);

  const std::vector<float> xf = widen(x);
  std::vector<float> ref(y_elems, 0.0f);
  LinearParams r = p;
  r.x = xf.data();
  r.weight = fp8 ? static_cast<const void*>(q.codes.data()) : static_cast<const void*>(w.data());
  r.weight_scales = fp8 ? q.scales.data() : nullptr;
  r.bias = c.bias ? bias.data() : nullptr;
  r.y = ref.data();
  r.y_fp32 = false;
  cpu::ThreadPool pool(2);
  cpu::linear_cpu(r, pool);

  const double u = 0x1p-24;
  const double sum_factor = 2.1 * (real_cublas ? 4.0 : 1.0) * static_cast<double>(c.in + 1) * u;
  std::size_t misses = 0;
  double worst = 0.0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    for (int64_t o = 0; o < y_stride; ++o) {
      const std::size_t at = static_cast<std::size_t>(t * y_stride + o);
      if (o >= c.out) {  // padding columns: untouched
        const std::size_t width = c.y_fp32 ? 4 : 2;
        misses += !std::equal(got.begin() + static_cast<std::ptrdiff_t>(at * width),
                              got.begin() + static_cast<std::ptrdiff_t>((at + 1) * width), y_init.begin());
        continue;
      }
      double magnitude = c.bias ? std::fabs(bf16_decode(bias[static_cast<std::size_t>(o)])) : 0.0;
      for (int64_t k = 0; k < c.in; ++k) {
        const std::size_t wk = static_cast<std::size_t>(o * c.in + k);
        magnitude += std::fabs(static_cast<double>(xf[static_cast<std::size_t>(t * x_stride + k)]) *
                               (fp8 ? q.dequantized[wk] : bf16_decode(w[wk])));
      }
      float value;
      if (c.y_fp32) {
        std::memcpy(&value, got.data() + at * 4, 4);
      } else {
        std::uint16_t bits;
        std::memcpy(&bits, got.data() + at * 2, 2);
        value = bf16_decode(bits);
      }
      const double expected = ref[at];
      const double bound = (c.y_fp32 ? 0.0 : 0x1p-8 * std::fabs(expected)) + sum_factor * magnitude;
      const double error = std::fabs(value - expected);
      worst = std::max(worst, error / (bound > 0 ? bound : 1.0));
      if (!(error <= bound) && ++misses <= 5) {
        UNSCOPED_INFO("y[" << t << ", " << o << "] = " << value << ", expected " << expected << " +- " << bound);
      }
    }
  }
  INFO("worst error / bound " << worst);
  CHECK(misses == 0);
}

}  // namespace

TEST_CASE("linear on CUDA matches the CPU op within the fp32 reordering bound", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  std::vector<LinearCase> cases = {
      {5, 576, 576 + 2 * 192},       // SmolLM2 qkv
      {1, 576, 2 * 1536},            // SmolLM2 gate_up, one decode token
      {67, 1536, 576},               // SmolLM2 down, two row tiles
      {3, 896, 896 + 2 * 128, true}, // Qwen2-0.5B qkv with its bias
      {2, 576, 1000, false, true},   // an LM head: fp32 logits
      {2, 576, 1000, true, true},    // fp32 y with a bias (a kernel after cuBLASLt)
      {4, 100, 37},                  // odd shapes: the element-at-a-time loads
      {9, 576, 192, false, false, 576 + 2 * 192 - 576, 64},  // a column slice of x, a strided y
  };
  if (!kEmulated) {
    cases.push_back({300, 4096, 4096 + 2 * 1024});  // Llama-3-8B qkv
    cases.push_back({7, 4096, 2 * 14336});          // gate_up
    cases.push_back({1, 14336, 4096});              // down, one decode token
  }
  cases.push_back({5, 576, 576 + 2 * 192, false, false, 0, 0, 0});        // FP8, a scale per row
  cases.push_back({1, 1536, 576, false, false, 0, 0, 128});              // FP8, 128-input blocks
  cases.push_back({3, 900, 1152, true, false, 0, 0, 64});                // FP8 + bias, a partial last block
  cases.push_back({2, 576, 1000, false, true, 0, 0, 0});                 // FP8 LM head, fp32 logits
  for (std::size_t i = 0; i < cases.size(); ++i) check_linear(*gpu, cases[i], Path::backend, static_cast<std::uint32_t>(50 + i));
  // The portable GEMM is for FP8 weights alone: bf16 ones run on cuBLASLt.
  LinearParams bf16;
  bf16.num_tokens = 1, bf16.in_features = 8, bf16.out_features = 8;
  CHECK_THROWS_WITH(cuda::linear_portable_cuda(bf16, nullptr), Catch::Contains("FP8 weights only"));
}

// The review's defect: a plan per token count, never evicted, grew with every prefill chunk size.
TEST_CASE("the cuBLASLt plan cache stays within its bound as token counts vary", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  constexpr std::size_t kMaxPlans = 3;
  cuda::CublasLtLinear linear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, kMaxPlans);
  // Ten token counts, then the first ones again (evicted by then: planned anew, still right).
  const std::vector<int64_t> tokens = {1, 7, 2, 33, 5, 64, 3, 17, 9, 40, 1, 7, 2};
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    check_linear(*gpu, {tokens[i], 64, 96, i % 2 == 0}, Path::cublaslt, static_cast<std::uint32_t>(300 + i), &linear);
    CHECK(linear.num_cached_plans() <= kMaxPlans);
  }
  CHECK(linear.num_cached_plans() == kMaxPlans);
  CHECK_THROWS_AS(cuda::CublasLtLinear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 0), std::invalid_argument);
}

#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
// Failures the emulator can make happen (a GPU cannot be asked to): each error says what failed,
// cuBLASLt's refusals with the rule the stand-in applied.
TEST_CASE("CublasLtLinear's failures say what failed", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  {
    cuda::CublasLtLinear linear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 4);
    DeviceBuffer x(*gpu, 64 * 2), w(*gpu, 64 * 64 * 2), y(*gpu, 64 * 2);
    LinearParams p;
    p.x = x.data(), p.weight = w.data(), p.y = y.data();
    p.num_tokens = 1, p.in_features = 64, p.out_features = 64;
    cudaStream_t gone = nullptr;
    REQUIRE(cudaStreamCreate(&gone) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(gone) == cudaSuccess);
    CHECK_THROWS_WITH(linear.run(p, gone), Catch::Contains("cublasLtMatmul") && Catch::Contains("stand-in"));
    (void)cudaGetLastError();
    // x one byte off its bf16 alignment: refused while the plan is made (a GPU would fault).
    p.x = static_cast<const char*>(x.data()) + 1;
    try {
      linear.run(p, nullptr);
      FAIL("a misaligned x was accepted");
    } catch (const std::runtime_error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("stand-in") != std::string::npos);
    }
  }
  size_t free = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free, &total) == cudaSuccess);
  fp8serve::emu::set_device_memory_bytes(total - free + (1 << 20));  // 1 MiB left: no 32 MiB workspace
  CHECK_THROWS_WITH(cuda::CublasLtLinear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 4),
                    Catch::Contains("cudaMalloc(cuBLASLt workspace)"));
  (void)cudaGetLastError();
  fp8serve::emu::set_device_memory_bytes(total);
}
#endif
