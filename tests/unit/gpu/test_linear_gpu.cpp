// [gpu] The projections: the CUDA backend's linear (linear_cublaslt.cpp on cuBLASLt - the real
// library on a GPU, the emulator's cuBLASLt stand-in in CI - for bf16 weights), against
// the CPU op (linear_cpu) on the same bf16 x widened to fp32 and the same bf16 weights:
// Llama-3-8B's qkv / gate_up / down (GPU), SmolLM2 and Qwen2-0.5B shapes with the QKV bias
// (emulator too), the LM head's fp32 logits, row strides on both sides, 1 to 300 tokens; FP8
// weights (one scale per row, or per row and block of 64, 128, 192 or 2048 inputs, the project's
// quantizer) on the tensor-core GEMV (linear_fp8_gemv.cu), which the backend runs for them -
// 1 to 16 tokens in one launch (one or two token tiles), more in groups of 16, 16-byte and byte
// loads of W, slices that end inside a block - against the CPU op on the same codes and scales;
// the GEMV's determinism and batch invariance, bitwise; more than 16 tokens on cuBLASLt's FP8 GEMM
// (per-row scales as OUTER_VEC_32F, 128-blocks as VEC128_32F) where it takes the shape, its
// activation quantizer bitwise against the host codec; and the cuBLASLt plan cache, which stays
// within its bound as token counts vary.
//
// Tolerance, per element: the two fp32 dot products differ only in summation order, each within
// (K - 1) u sum|x w| of the exact value (u = 2^-24; the standard bound), so they differ by at
// most 2 K u sum|x w|; the bias adds one rounding of |y|. A bf16 y then adds half a bf16 ulp:
//   |y_gpu - y_cpu| <= 2^-8 |y_cpu| + 2.1 K u (sum|x w| + |bias|)      (fp32 y: no 2^-8 term)
// cuBLASLt's tensor cores accumulate in fp32 but may round their partial sums differently
// (split-K, truncating alignment), so its sum term gets a factor 4 on a GPU, and so does the
// FP8 GEMV's (mma.sync accumulates in the same tensor cores). The FP8 GEMV also rounds x to f16
// after scaling each token row's k slice by a power of two that puts its largest |x| at
// [2^15, 2^16): exact for bf16 values except those that land among f16's subnormals (more than
// 2^29 below that maximum), each off by at most half of f16's smallest subnormal (2^-25) times
// the inverse scale 2^(e - 15), e the maximum's exponent; summed over the row that adds at most
//   2^-40 max|x[t]| sum_k |W[o, k]|
// (the per-block and per-row scale multiplications and the sum of the k slices are a few more
// fp32 roundings per block, well inside the K u term). The FP8 GEMM (more than 16 tokens) rounds
// x to E4M3 with scale s = max|x| / 448 of the token row (or of its 128-input block, no larger):
// each element off by at most 2^-4 of itself (3 significand bits, round to nearest) or, among
// E4M3's subnormals, by half the smallest one (2^-10 s), so it adds
//   2^-4 sum|x w| + 2^-10 (max|x[t]| / 448) sum_k |W[o, k]|.
// The bound is rarely approached (real errors are ~sqrt(K) u): a wrong transpose, stride or
// tile edge shows up as errors of the order of |y| itself.
#include <cmath>
#include <cstdlib>

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

// backend: CudaBackend::linear (cuBLASLt for bf16 weights, the FP8 GEMV for FP8 ones);
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
  const double sum_factor = 2.1 * (real_cublas || (fp8 && !kEmulated) ? 4.0 : 1.0) * static_cast<double>(c.in + 1) * u;
  const bool fp8_gemm = fp8 && c.tokens > cuda::kFp8GemvMaxTokens && cuda::CublasLtLinear::device_has_fp8_gemm() &&
                        cuda::CublasLtLinear::fp8_gemm_supported(p);
  INFO((fp8 ? (fp8_gemm ? "on the FP8 GEMM" : "on the FP8 GEMV") : "on cuBLASLt (bf16)"));
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
      double x_max = 0.0, w_sum = 0.0;  // the FP8 GEMV's f16 rounding of x
      for (int64_t k = 0; k < c.in; ++k) {
        const std::size_t wk = static_cast<std::size_t>(o * c.in + k);
        const double xv = xf[static_cast<std::size_t>(t * x_stride + k)];
        const double wv = fp8 ? q.dequantized[wk] : bf16_decode(w[wk]);
        magnitude += std::fabs(xv * wv);
        x_max = std::max(x_max, std::fabs(xv));
        w_sum += std::fabs(wv);
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
      const double bound = (c.y_fp32 ? 0.0 : 0x1p-8 * std::fabs(expected)) + sum_factor * magnitude +
                           (fp8 ? 0x1p-40 * x_max * w_sum : 0.0) +
                           (fp8_gemm ? 0x1p-4 * magnitude + 0x1p-10 * x_max / 448.0 * w_sum : 0.0);
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
  // FP8 weights on the GEMV: every scale kind, both token tiles (<= 8, 9..16), groups of 16 beyond.
  cases.push_back({5, 576, 576 + 2 * 192, false, false, 0, 0, 0});        // FP8, a scale per row
  cases.push_back({1, 1536, 576, false, false, 0, 0, 128});              // FP8, 128-input blocks
  cases.push_back({3, 900, 1152, true, false, 0, 0, 64});                // FP8 + bias, a partial last block; byte loads
  cases.push_back({2, 576, 1000, false, true, 0, 0, 0});                 // FP8 LM head, fp32 logits
  cases.push_back({16, 896, 200, true, false, 0, 0, 128});               // two token tiles, rows past n in the last warp
  cases.push_back({9, 1344, 136, false, true, 0, 0, 192});               // 9 tokens, 192-input blocks (slices of 384)
  cases.push_back({2, 2304, 48, false, false, 0, 0, 2048});              // blocks larger than a slice: folded at slice ends
  cases.push_back({4, 100, 37, true, false, 0, 0, 0});                   // odd shapes: byte loads, a K tail inside a chunk
  cases.push_back({6, 4160, 64, false, false, 0, 0, 0});                 // a partial last step (K = 16 chunks + 1)
  cases.push_back({17, 576, 96, false, false, 64, 8, 0});                // 17 tokens: a group of 16 and one of 1, strides
  cases.push_back({40, 328, 80, true, true, 0, 3, 64});                  // three groups (16, 16, 8), fp32 y, byte loads
  cases.push_back({12, 520, 50, false, false, 0, 0, 0});                 // two token tiles, byte loads, a scale per row
  // More than 16 tokens: cuBLASLt's FP8 GEMM where sm_90 takes it, else the GEMV in groups.
  cases.push_back({64, 512, 256, true, false, 0, 0, 128});               // FP8 GEMM, VEC128 scales, bias epilogue
  cases.push_back({33, 256, 1000, false, true, 0, 0, 0});                // FP8 GEMM, OUTER_VEC scales, fp32 logits
  cases.push_back({21, 640, 136, true, true, 16, 4, 128});               // FP8 GEMM, fp32 y + bias kernel, strides
  cases.push_back({20, 384, 192, true, false, 0, 0, 64});                // 64-blocks: no scale mode -> GEMV groups
  cases.push_back({24, 384, 100, false, false, 0, 0, 0});                // out * 2 bytes not a multiple of 16 -> groups
  if (!kEmulated) {
    cases.push_back({1, 4096, 4096 + 2 * 1024, false, false, 0, 0, 0});  // Llama-3-8B qkv, decode
    cases.push_back({16, 14336, 4096, false, false, 0, 0, 128});          // down, 16 tokens, block scales
  }
  for (std::size_t i = 0; i < cases.size(); ++i) check_linear(*gpu, cases[i], Path::backend, static_cast<std::uint32_t>(50 + i));
}

namespace {

// The FP8 GEMV's y for `tokens` rows of x starting at row `first` of a [rows, in] x (the weights
// and scales uploaded once), as raw bf16 bits.
struct Fp8Fixture {
  int64_t rows, in, out, block;
  std::vector<std::uint16_t> x;
  Fp8Weights q;
};
std::vector<std::uint16_t> fp8_rows(Backend& gpu, const Fp8Fixture& f, int64_t first, int64_t tokens) {
  DeviceBuffer d_x = to_device(gpu, f.x), d_w = to_device(gpu, f.q.codes), d_s = to_device(gpu, f.q.scales);
  DeviceBuffer d_y(gpu, static_cast<std::size_t>(tokens * f.out) * 2);
  LinearParams p;
  p.x = d_x.as<std::uint16_t>() + first * f.in;
  p.weight = d_w.data();
  p.weight_dtype = WeightDtype::fp8_e4m3;
  p.weight_scales = d_s.as<float>();
  p.weight_block_k = f.block;
  p.y = d_y.data();
  p.num_tokens = tokens;
  p.in_features = f.in;
  p.out_features = f.out;
  gpu.linear(p, Stream{});
  return to_host<std::uint16_t>(gpu, d_y, static_cast<std::size_t>(tokens * f.out));
}

}  // namespace

// y[t] must be the same bits whatever else is in the batch (test_batching's contract) and from
// run to run: the GEMV has no atomics, a split count that depends on the shape alone, and a
// token's f16 scaling that depends on its own row alone. (More than 16 tokens on the FP8 GEMM are
// as batch invariant as cuBLASLt is for bf16 weights: an algorithm per token count.)
TEST_CASE("the FP8 GEMV is deterministic and batch invariant, bitwise", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  for (const int64_t block : {int64_t{0}, int64_t{128}}) {
    // 68 outputs: not a shape the FP8 GEMM takes, so 20 tokens run the GEMV in two groups.
    Fp8Fixture f{20, 1280, 68, block, {}, {}};
    f.x = random_bf16(static_cast<std::size_t>(f.rows * f.in), 91, 1.0f);
    // One token row 2^20 times larger than the others: its f16 scale must not touch theirs.
    for (int64_t k = 0; k < f.in; ++k) {
      const std::size_t at = static_cast<std::size_t>(3 * f.in + k);
      f.x[at] = bf16_encode(bf16_decode(f.x[at]) * 1048576.0f);
    }
    f.q = quantize(random_bf16(static_cast<std::size_t>(f.out * f.in), 92, 0.03f), f.out, f.in, block);
    INFO("block " << block);
    const std::vector<std::uint16_t> all = fp8_rows(*gpu, f, 0, f.rows);
    CHECK(fp8_rows(*gpu, f, 0, f.rows) == all);
    for (const int64_t t : {int64_t{0}, int64_t{3}, int64_t{9}, int64_t{15}, int64_t{16}, int64_t{19}}) {
      INFO("row " << t);
      const std::vector<std::uint16_t> alone = fp8_rows(*gpu, f, t, 1);
      CHECK(std::equal(alone.begin(), alone.end(), all.begin() + t * f.out));
    }
    // 12 rows (two token tiles) against the same rows inside the 20-row batch.
    const std::vector<std::uint16_t> some = fp8_rows(*gpu, f, 4, 12);
    CHECK(std::equal(some.begin(), some.end(), all.begin() + 4 * f.out));
  }
}

// The split plan: whole blocks per slice when a block fits one, 256 to 1024 inputs, whole rounds of
// 264 CTAs (2 per SM of 132) weighed against each CTA's fixed cost of about 512 inputs; the
// tickets; and the GEMV's refusals.
TEST_CASE("the FP8 GEMV plans its splits from the shape and refuses what it cannot run", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const cuda::Fp8GemvPlan o_proj = cuda::plan_linear_fp8_gemv(4096, 4096, 0);
  CHECK(o_proj.slice == 512);  // 32 row blocks x 8 = 256 CTAs: one round of 2-step CTAs, not two of 1
  CHECK(o_proj.splits == 8);
  const cuda::Fp8GemvPlan qkv = cuda::plan_linear_fp8_gemv(4096, 6144, 0);
  CHECK(qkv.slice == 832);  // 48 x 5 = 240 CTAs, one round (4 splits of 1024: 192, a longer round)
  CHECK(qkv.splits == 5);
  const cuda::Fp8GemvPlan up = cuda::plan_linear_fp8_gemv(4096, 14336, 0);
  CHECK(up.slice == 1024);  // 112 x 4 = 448 CTAs in 2 rounds (5 splits: 560 in 3)
  const cuda::Fp8GemvPlan down = cuda::plan_linear_fp8_gemv(14336, 4096, 128);
  CHECK(down.slice == 896);  // 7 whole blocks: 32 x 16 = 512 CTAs in 2 rounds
  CHECK(down.splits == 16);
  const cuda::Fp8GemvPlan blocks192 = cuda::plan_linear_fp8_gemv(1344, 136, 192);
  CHECK(blocks192.slice == 384);  // two whole blocks: 4 CTAs along k
  CHECK(cuda::plan_linear_fp8_gemv(64, 8, 0).slice == 64);  // never more than the row
  CHECK(cuda::linear_fp8_gemv_workspace_bytes(40, 4096, 4096, 0) == 8u * 16u * 4096u * 4u);

  DeviceBuffer buffer(*gpu, 4096);
  LinearParams p;
  p.x = buffer.data(), p.weight = buffer.data(), p.y = buffer.data();
  p.num_tokens = 1, p.in_features = 64, p.out_features = 8;
  auto* tickets = buffer.as<unsigned>();
  CHECK(cuda::linear_fp8_gemv_tickets(129) == 2);
  CHECK_THROWS_WITH(cuda::linear_fp8_gemv_cuda(p, buffer.data(), 4096, tickets, 1, nullptr),
                    Catch::Contains("FP8 weights only"));
  p.weight_dtype = WeightDtype::fp8_e4m3;
  p.weight_scales = buffer.as<float>();
  CHECK_THROWS_WITH(cuda::linear_fp8_gemv_cuda(p, buffer.data(), 4, tickets, 1, nullptr),
                    Catch::Contains("workspace too small"));
  CHECK_THROWS_WITH(cuda::linear_fp8_gemv_cuda(p, buffer.data(), 4096, tickets, 0, nullptr),
                    Catch::Contains("too few tickets"));
  p.num_tokens = 0;
  cuda::linear_fp8_gemv_cuda(p, nullptr, 0, nullptr, 0, nullptr);  // nothing to do, nothing launched
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

// The FP8 GEMM's activation quantizer against the host codec (kernels/fp8_quantize.hpp, the one
// the weights use): the same codes and scales, bitwise, per token and per token and 128-input
// block (in VEC128_32F's layout); the weights' block scales re-laid out for VEC128_32F; and the
// refusals of the paths that cannot run a shape.
TEST_CASE("the FP8 GEMM's activation quantizer matches the host codec bitwise", "[gpu][linear]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t tokens = 5, k = 400, stride = 416, blocks = 4, pad = 8;
  std::vector<std::uint16_t> x = random_bf16(static_cast<std::size_t>(tokens * stride), 77, 3.0f);
  for (int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(2 * stride + i)] = 0;  // a zero row: FLT_MIN
  x[static_cast<std::size_t>(3 * stride + 7)] = bf16_encode(1e-30f);                 // subnormal codes
  DeviceBuffer d_x = to_device(*gpu, x);
  DeviceBuffer d_codes(*gpu, static_cast<std::size_t>(tokens * k)), d_scales(*gpu, static_cast<std::size_t>(blocks * pad * 4));
  for (const bool per_block : {false, true}) {
    INFO((per_block ? "per 128-input block" : "per token"));
    gpu->synchronize(Stream{});
    cuda::fp8_quantize_act_cuda(d_x.as<std::uint16_t>(), stride, tokens, k, per_block, d_codes.as<std::uint8_t>(), k,
                                d_scales.as<float>(), pad, nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<std::uint8_t> codes = to_host<std::uint8_t>(*gpu, d_codes, static_cast<std::size_t>(tokens * k));
    const std::vector<float> scales = to_host<float>(*gpu, d_scales, static_cast<std::size_t>(blocks * pad));
    std::size_t misses = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> row = widen(std::vector<std::uint16_t>(x.begin() + t * stride, x.begin() + t * stride + k));
      for (int64_t b = 0; b < (per_block ? blocks : 1); ++b) {
        const int64_t k0 = b * 128, n = per_block ? std::min<int64_t>(128, k - k0) : k;
        std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
        float scale = 0.0f;
        quantize_row_fp8(row.data() + k0, n, want.data(), &scale);
        misses += scale != scales[static_cast<std::size_t>(per_block ? b * pad + t : t)];
        misses += !std::equal(want.begin(), want.end(), codes.begin() + t * k + k0);
      }
    }
    CHECK(misses == 0);
  }
  // [3 rows][2 blocks] -> [2][pad4(3) = 4].
  const std::vector<float> by_row = {1, 2, 3, 4, 5, 6};
  DeviceBuffer d_in = to_device(*gpu, by_row), d_out = to_device(*gpu, std::vector<float>(8, -1.0f));
  gpu->synchronize(Stream{});
  cuda::fp8_scales_by_block_cuda(d_in.as<float>(), 3, 2, d_out.as<float>(), 4, nullptr);
  cuda::fp8_scales_by_block_cuda(d_in.as<float>(), 0, 2, d_out.as<float>(), 4, nullptr);  // nothing to do
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(to_host<float>(*gpu, d_out, 8) == std::vector<float>{1, 3, 5, -1, 2, 4, 6, -1});

  cuda::fp8_quantize_act_cuda(nullptr, 0, 0, 16, false, nullptr, 0, nullptr, 0, nullptr);  // no tokens: nothing
  CHECK_THROWS_WITH(cuda::fp8_quantize_act_cuda(d_x.as<std::uint16_t>(), 20000, 1, 20000, false, d_codes.as<std::uint8_t>(),
                                                20000, d_scales.as<float>(), 1, nullptr),
                    Catch::Contains("per-block scales"));
  LinearParams p;
  p.weight = d_codes.data(), p.y = d_scales.data(), p.weight_scales = d_scales.as<float>();
  p.weight_dtype = WeightDtype::fp8_e4m3;
  p.num_tokens = 32, p.in_features = 64, p.out_features = 8;
  CHECK(cuda::CublasLtLinear::fp8_gemm_supported(p));
  p.weight_block_k = 64;
  CHECK(cuda::CublasLtLinear::fp8_gemm_supported(p));  // one block a row: one scale per row
  p.in_features = 128;
  CHECK_FALSE(cuda::CublasLtLinear::fp8_gemm_supported(p));  // no 64-input scale mode
  p.weight_block_k = 0, p.in_features = 20000;
  CHECK_FALSE(cuda::CublasLtLinear::fp8_gemm_supported(p));  // longer than the quantizer's row
  p.in_features = 64;
  cuda::CublasLtLinear linear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 2);
  p.out_features = 9;  // 18 bytes a column of D
  CHECK_THROWS_WITH(linear.run_fp8(p, cuda::Fp8GemmOperands{}, nullptr), Catch::Contains("FP8 weights in a shape"));
}

TEST_CASE("FP8 weights on a device without sm_90's FP8 GEMM run on the GEMV, never a throw", "[gpu][linear]") {
  if (!kEmulated) return;  // only the emulator can present another device
  for (const char* sm : {"80", "89", "100"}) {
    INFO("the emulator presents sm_" << sm);
    ::setenv("FP8SERVE_EMU_SM", sm, 1);
    auto gpu = cuda_backend_or_skip();
    REQUIRE(gpu);
    CHECK_FALSE(cuda::CublasLtLinear::device_has_fp8_gemm());
    // More than 16 tokens, shapes sm_90's GEMM would take (its stand-in refuses FP8 here, so a
    // missed check throws).
    check_linear(*gpu, {64, 512, 256, true, false, 0, 0, 128}, Path::backend, 71);
    check_linear(*gpu, {33, 256, 1000, false, true, 0, 0, 0}, Path::backend, 72);
    cuda::CublasLtLinear linear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 2);
    CHECK_FALSE(linear.fp8_gemm_available());
    LinearParams p;
    p.weight_dtype = WeightDtype::fp8_e4m3;
    p.num_tokens = 32, p.in_features = 64, p.out_features = 8;
    CHECK_THROWS_WITH(linear.run_fp8(p, cuda::Fp8GemmOperands{}, nullptr), Catch::Contains("sm_90 only"));
  }
  ::unsetenv("FP8SERVE_EMU_SM");
  CHECK(cuda::CublasLtLinear::device_has_fp8_gemm());
  CHECK(cuda::CublasLtLinear(cuda::CublasLtLinear::kDefaultWorkspaceBytes, 2).fp8_gemm_available());
}
