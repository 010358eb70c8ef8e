// [gpu] The per-head Walsh-Hadamard transform of --kv-rotation on the CUDA backend against the CPU
// op (head_hadamard_cpu, itself checked against Sylvester's matrix in tests/unit/ops) on the
// same bf16 values: q | k | v heads of fused rows at real head dims (Llama-3-8B's 128, SmolLM2's
// 64, the tiny fixtures' 16), heads enough for several groups a token, a head_dim that is not a
// power of two, and the attention output's dense rows.
//
// Tolerance: none. Both sides run the same butterflies in the same order with separately rounded
// fp32 adds and subtracts, then one product with the same scale, so the device's bf16 output is
// the host's fp32 result rounded once.
#include "cuda_test_util.hpp"
#include "kernels/cpu/ops.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

void check_hadamard(Backend& gpu, int64_t head_dim, int64_t heads, int64_t row_heads, int64_t tokens, std::uint32_t seed) {
  INFO("head_dim " << head_dim << " heads " << heads << " of " << row_heads << " tokens " << tokens);
  const int64_t row = row_heads * head_dim;
  const std::vector<std::uint16_t> x = random_bf16(static_cast<std::size_t>(tokens * row), seed, 3.0f);
  DeviceBuffer d_x = to_device(gpu, x);
  HeadHadamardParams p;
  p.x = d_x.data();
  p.num_tokens = tokens;
  p.num_heads = heads;
  p.head_dim = head_dim;
  p.token_stride = row == heads * head_dim ? 0 : row;
  gpu.head_hadamard(p, Stream{});
  const std::vector<std::uint16_t> got = to_host<std::uint16_t>(gpu, d_x, x.size());

  std::vector<float> expected = widen(x);
  cpu::ThreadPool pool(1);
  HeadHadamardParams ref = p;
  ref.x = expected.data();
  cpu::head_hadamard_cpu(ref, pool);
  const UlpReport r = compare_bf16(got, expected, 0);
  CHECK(r.differ == 0);  // the rotated heads bit-exact, the rest of each row untouched
}

}  // namespace

TEST_CASE("head_hadamard on CUDA is bit-exact against the CPU op", "[gpu][hadamard]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t tokens = kEmulated ? 3 : 257;
  check_hadamard(*gpu, 128, 48, 48, tokens, 1);  // Llama-3-8B q | k | v: 3 groups of 16 heads
  check_hadamard(*gpu, 128, 32, 32, tokens, 2);  // its attention output
  check_hadamard(*gpu, 64, 12, 15, tokens, 3);   // SmolLM2 q | k, v left alone
  check_hadamard(*gpu, 16, 8, 8, 5, 4);          // tiny fixtures
  check_hadamard(*gpu, 96, 5, 7, 4, 5);          // 64 + 32 segments
  check_hadamard(*gpu, 7, 3, 3, 2, 6);           // 4 + 2 + 1
}

TEST_CASE("head_hadamard on CUDA: empty launches do nothing, an oversized head is refused", "[gpu][hadamard]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  HeadHadamardParams p;
  p.head_dim = 64;
  CHECK_NOTHROW(gpu->head_hadamard(p, Stream{}));  // no tokens
  p.head_dim = 4096;
  p.num_tokens = 1;
  p.num_heads = 1;
  CHECK_THROWS_AS(gpu->head_hadamard(p, Stream{}), std::invalid_argument);
}
