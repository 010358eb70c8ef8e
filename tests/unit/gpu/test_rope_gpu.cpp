// [gpu] RoPE on the CUDA backend against the CPU op (rope_cpu) on the same bf16 values and the
// same table (set_rope_table builds it on the host with make_rope_table): Llama-3-8B (head_dim
// 128, llama3 scaling), Qwen3 (128, theta 1e6), SmolLM2 (64), the tiny fixtures (16), q and k
// as slices of a fused qkv row, positions anywhere in the table.
//
// Tolerance: none. Both sides evaluate x0 * cos - x1 * sin and x1 * cos + x0 * sin with four
// separately rounded fp32 products (the device with __fmul_rn / __fsub_rn / __fadd_rn, which nvcc
// may not contract into FMAs), so the device's bf16 output is exactly the host's fp32 result
// rounded to bf16. The same holds with --kv-rotation's transform fused in (rotate_heads).
#include "cuda_test_util.hpp"
#include "kernels/cpu/ops.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

struct RopeCase {
  int64_t head_dim, q_heads, kv_heads;
  cpu::RopeConfig config;
  int64_t num_tokens;
  int64_t max_positions;
};

// rotate_heads: RopeParams::rotate_heads (0, q | k, or q | k | v), against the CPU's rope, its
// result rounded to bf16 (what the device stores between the two ops unfused), then head_hadamard.
void check_rope(Backend& gpu, const RopeCase& c, std::uint32_t seed, int64_t rotate_heads = 0) {
  INFO("head_dim " << c.head_dim << " heads " << c.q_heads << "/" << c.kv_heads << " tokens " << c.num_tokens
                   << " rotated heads " << rotate_heads);
  const std::vector<float> inv_freq = cpu::rope_inv_freq(c.config);
  gpu.set_rope_table(inv_freq, c.max_positions);
  const int64_t row = (c.q_heads + 2 * c.kv_heads) * c.head_dim;  // q | k | v
  const std::vector<std::uint16_t> qkv = random_bf16(static_cast<std::size_t>(c.num_tokens * row), seed, 2.0f);
  std::mt19937 rng(seed);
  std::vector<int32_t> positions(static_cast<std::size_t>(c.num_tokens));
  for (int32_t& p : positions) p = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.max_positions));
  positions.back() = static_cast<int32_t>(c.max_positions - 1);

  DeviceBuffer d_qkv = to_device(gpu, qkv);
  DeviceBuffer d_pos = to_device(gpu, positions);
  RopeParams p;
  p.q = d_qkv.data();
  p.k = d_qkv.as<std::uint16_t>() + c.q_heads * c.head_dim;
  p.positions = d_pos.as<int32_t>();
  p.num_tokens = c.num_tokens;
  p.num_q_heads = c.q_heads;
  p.num_kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.q_token_stride = row;
  p.k_token_stride = row;
  p.rotate_heads = rotate_heads;
  gpu.rope(p, Stream{});
  const std::vector<std::uint16_t> got = to_host<std::uint16_t>(gpu, d_qkv, qkv.size());

  std::vector<float> expected = widen(qkv);
  cpu::ThreadPool pool(1);
  RopeParams ref = p;
  ref.q = expected.data();
  ref.k = expected.data() + c.q_heads * c.head_dim;
  ref.positions = positions.data();
  cpu::rope_cpu(ref, cpu::make_rope_table(inv_freq, c.max_positions), pool);
  if (rotate_heads > 0) {
    const std::vector<float> rounded = widen(narrow(expected));
    std::copy(rounded.begin(), rounded.end(), expected.begin());  // in place: ref points into it
    cpu::head_hadamard_cpu(rope_rotation(ref, sizeof(float)), pool);
  }
  const UlpReport r = compare_bf16(got, expected, 0);
  CHECK(r.differ == 0);  // v and everything else untouched, q and k bit-exact
}

cpu::RopeConfig rope_config(int64_t rotary_dim, double theta, bool llama3) {
  cpu::RopeConfig c;
  c.rotary_dim = rotary_dim;
  c.theta = theta;
  if (llama3) c.scaling = cpu::RopeScaling::llama3;
  return c;
}

}  // namespace

TEST_CASE("rope on CUDA is bit-exact against the CPU op at real head dims", "[gpu][rope]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t tokens = kEmulated ? 9 : 333;
  const int64_t long_context = kEmulated ? 8192 : 131072;  // the table is built twice on the host
  check_rope(*gpu, {128, 32, 8, rope_config(128, 500000.0, true), tokens, long_context}, 1);  // Llama-3.1-8B
  check_rope(*gpu, {128, 16, 8, rope_config(128, 1000000.0, false), tokens, 40960}, 2);       // Qwen3-0.6B
  check_rope(*gpu, {64, 9, 3, rope_config(64, 100000.0, false), tokens, 8192}, 3);       // SmolLM2-135M
  check_rope(*gpu, {16, 4, 2, rope_config(16, 10000.0, false), 5, 256}, 4);              // tiny-llama
}

TEST_CASE("rope on CUDA with the rotation fused in: RoPE, then head_hadamard, bit for bit", "[gpu][rope][hadamard]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t tokens = kEmulated ? 5 : 333;
  // Llama-3.1-8B q | k | v: 48 heads, 3 groups of 16, the last all v (no RoPE in that block).
  check_rope(*gpu, {128, 32, 8, rope_config(128, 500000.0, true), tokens, 8192}, 11, 48);
  check_rope(*gpu, {64, 9, 3, rope_config(64, 100000.0, false), tokens, 8192}, 12, 15);  // SmolLM2, K and V
  check_rope(*gpu, {64, 9, 3, rope_config(64, 100000.0, false), tokens, 8192}, 13, 12);  // q and K only
  check_rope(*gpu, {16, 4, 2, rope_config(16, 10000.0, false), 3, 256}, 14, 8);          // tiny-llama
  check_rope(*gpu, {40, 3, 1, rope_config(20, 10000.0, false), 4, 64}, 15, 5);           // partial rotary, 32 + 8
}

TEST_CASE("rope with the rotation fused in refuses a span that is not q | k", "[gpu][rope][hadamard]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  gpu->set_rope_table(cpu::rope_inv_freq(rope_config(64, 10000.0, false)), 16);
  DeviceBuffer d_qkv = to_device(*gpu, random_bf16(4 * 64, 7));
  DeviceBuffer d_pos = to_device(*gpu, std::vector<int32_t>{3});
  RopeParams p;
  p.q = d_qkv.data();
  p.k = d_qkv.as<std::uint16_t>() + 2 * 64;
  p.positions = d_pos.as<int32_t>();
  p.num_tokens = 1;
  p.num_q_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim = 64;
  p.q_token_stride = p.k_token_stride = 4 * 64;
  p.rotate_heads = 2;  // leaves k out
  CHECK_THROWS_AS(gpu->rope(p, Stream{}), std::invalid_argument);
  p.rotate_heads = 5;  // past the row
  CHECK_THROWS_AS(gpu->rope(p, Stream{}), std::invalid_argument);
  p.rotate_heads = 4;
  p.k = d_qkv.as<std::uint16_t>() + 3 * 64;  // k not right after q
  CHECK_THROWS_AS(gpu->rope(p, Stream{}), std::invalid_argument);
  p.k = d_qkv.as<std::uint16_t>() + 2 * 64;
  CHECK_NOTHROW(gpu->rope(p, Stream{}));
  CHECK_NOTHROW(gpu->synchronize(Stream{}));
}

TEST_CASE("rope on CUDA: a partial rotary dim takes the scalar path", "[gpu][rope]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  // head_dim 40 rotating its first 20 elements: half = 10, not a multiple of 8 -> one element a
  // thread; elements 20..39 of each head stay as they are.
  check_rope(*gpu, {40, 3, 1, rope_config(20, 10000.0, false), 6, 64}, 5);
}

TEST_CASE("rope on CUDA: a position outside the table is reported, not read", "[gpu][rope]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  gpu->set_rope_table(cpu::rope_inv_freq(rope_config(64, 10000.0, false)), 16);
  const std::vector<std::uint16_t> q = random_bf16(2 * 64, 6);
  DeviceBuffer d_q = to_device(*gpu, q);
  DeviceBuffer d_pos = to_device(*gpu, std::vector<int32_t>{3, 16});
  RopeParams p;
  p.q = d_q.data();
  p.positions = d_pos.as<int32_t>();
  p.num_tokens = 2;
  p.num_q_heads = 1;
  p.head_dim = 64;
  gpu->rope(p, Stream{});
  CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
  // The bad token's row is left as it was; the backend keeps working.
  const std::vector<std::uint16_t> after = to_host<std::uint16_t>(*gpu, d_q, q.size());
  CHECK(std::equal(after.begin() + 64, after.end(), q.begin() + 64));
  CHECK_NOTHROW(gpu->synchronize(Stream{}));
  p.rotate_heads = 1;  // the fused launch reports it the same way and leaves the row as it was
  gpu->rope(p, Stream{});
  CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
  const std::vector<std::uint16_t> fused = to_host<std::uint16_t>(*gpu, d_q, q.size());
  CHECK(std::equal(fused.begin() + 64, fused.end(), q.begin() + 64));
}
