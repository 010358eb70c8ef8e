// [gpu] RMSNorm on the CUDA backend against the CPU op (rms_norm_cpu) on the same bf16 values:
// whole hidden rows (SmolLM2 576, Qwen3-0.6B 1024, Llama-3-8B / Qwen3-8B 4096, tiny 64), Qwen3's
// per-head q/k norm in place on slices of a fused qkv row, the fused residual add, and the
// element-at-a-time path (rows that 16-byte vectors cannot read).
//
// Tolerance: 1 bf16 ulp. Both sides compute in fp32 in the same order of operations but for
// the sum of squares (a 32-lane xor tree against 16 lanes): that moves mean(x^2) by ~dim * 2^-24
// relative, far below bf16's 2^-9 half-step, so the device's bf16 output is the rounding of the
// host's fp32 value or, when that value lies within ~2^-20 of a rounding boundary, its neighbour.
// The fused add's new residual is exact: bf16(r + x) computed in fp32 on both sides.
#include <algorithm>

#include "cuda_test_util.hpp"
#include "kernels/cpu/ops.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

struct NormCase {
  int64_t num_tokens = 1;
  int64_t num_heads = 1;
  int64_t dim = 0;
  int64_t row_width = 0;  // elements per token of the tensor holding x (>= num_heads * dim)
  int64_t column = 0;     // where x's slice starts inside a row
  bool in_place = false;  // out = x
  bool fused = false;     // with a packed residual stream
};

void check_norm(Backend& gpu, const NormCase& c, std::uint32_t seed) {
  INFO("tokens " << c.num_tokens << " heads " << c.num_heads << " dim " << c.dim << " row " << c.row_width
                 << " column " << c.column << (c.in_place ? " in place" : "") << (c.fused ? " fused" : ""));
  const auto tensor = static_cast<std::size_t>(c.num_tokens * c.row_width);
  const auto stream_size = static_cast<std::size_t>(c.num_tokens * c.num_heads * c.dim);
  const std::vector<std::uint16_t> x = random_bf16(tensor, seed, 1.5f);
  const std::vector<std::uint16_t> weight = random_bf16(static_cast<std::size_t>(c.dim), seed + 1, 0.5f);
  const std::vector<std::uint16_t> residual = random_bf16(stream_size, seed + 2, 3.0f);
  const std::vector<std::uint16_t> out_init(tensor, bf16_encode(-7.0f));

  DeviceBuffer d_x = to_device(gpu, x);
  DeviceBuffer d_out = to_device(gpu, out_init);
  DeviceBuffer d_w = to_device(gpu, weight);
  DeviceBuffer d_res = to_device(gpu, residual);
  RmsNormParams p;
  p.x = static_cast<std::uint16_t*>(d_x.data()) + c.column;
  p.out = static_cast<std::uint16_t*>(c.in_place ? d_x.data() : d_out.data()) + c.column;
  p.weight = d_w.as<std::uint16_t>();
  p.residual = c.fused ? d_res.data() : nullptr;
  p.num_tokens = c.num_tokens;
  p.num_heads = c.num_heads;
  p.dim = c.dim;
  p.x_token_stride = c.row_width;
  p.out_token_stride = c.row_width;
  p.eps = 1e-6f;
  gpu.rms_norm(p, Stream{});
  const std::vector<std::uint16_t> got = to_host<std::uint16_t>(gpu, c.in_place ? d_x : d_out, tensor);
  const std::vector<std::uint16_t> got_residual = to_host<std::uint16_t>(gpu, d_res, stream_size);

  // Host reference: the norm's input is x, or for the fused op the stream after the add, which
  // the device stores (and normalizes) in bf16.
  std::vector<float> input = widen(x);
  std::vector<std::uint16_t> expected_residual = residual;
  int64_t in_stride = c.row_width, in_column = c.column;
  if (c.fused) {
    input.assign(stream_size, 0.0f);
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      for (int64_t i = 0; i < c.num_heads * c.dim; ++i) {
        const auto at = static_cast<std::size_t>(t * c.num_heads * c.dim + i);
        expected_residual[at] = bf16_encode(bf16_decode(residual[at]) +
                                            bf16_decode(x[static_cast<std::size_t>(t * c.row_width + c.column + i)]));
        input[at] = bf16_decode(expected_residual[at]);
      }
    }
    in_stride = c.num_heads * c.dim;
    in_column = 0;
  }
  std::vector<float> expected = c.in_place ? widen(x) : widen(out_init);
  cpu::ThreadPool pool(1);
  RmsNormParams ref = p;
  ref.x = input.data() + in_column;
  ref.x_token_stride = in_stride;
  ref.out = expected.data() + c.column;
  ref.weight = weight.data();
  ref.residual = nullptr;
  cpu::rms_norm_cpu(ref, pool);

  const UlpReport r = compare_bf16(got, expected, 1);
  CHECK(r.beyond == 0);
  CHECK(r.differ <= tensor / 50 + 2);  // off by one ulp only near a rounding boundary
  if (c.fused) CHECK(count_mismatches(got_residual, expected_residual) == 0);
}

}  // namespace

TEST_CASE("rms_norm on CUDA: whole hidden rows match the CPU op within 1 bf16 ulp", "[gpu][norm]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const std::vector<int64_t> tokens = kEmulated ? std::vector<int64_t>{1, 7} : std::vector<int64_t>{1, 7, 33, 517};
  for (const int64_t hidden : {64, 576, 1024, 4096, 8192}) {
    for (const int64_t t : tokens) check_norm(*gpu, {t, 1, hidden, hidden, 0, false, false}, 10);
  }
  check_norm(*gpu, {3, 1, 4096, 4096, 0, true, false}, 11);  // in place
}

TEST_CASE("rms_norm on CUDA: Qwen3 per-head q/k norm in place on a fused qkv row", "[gpu][norm]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  // Qwen3-8B: 32 q heads, 8 kv heads, head_dim 128; row = q | k | v. Columns outside the slice
  // must keep their values (the comparison covers the whole tensor).
  const int64_t head_dim = 128, q_heads = 32, kv_heads = 8;
  const int64_t row = (q_heads + 2 * kv_heads) * head_dim;
  for (const int64_t t : {1, 5}) {
    check_norm(*gpu, {t, q_heads, head_dim, row, 0, true, false}, 20);
    check_norm(*gpu, {t, kv_heads, head_dim, row, q_heads * head_dim, true, false}, 21);
  }
  // tiny-qwen3 fixture: head_dim 32; tiny-llama: 16.
  check_norm(*gpu, {9, 4, 32, (4 + 2 * 2) * 32, 0, true, false}, 22);
  check_norm(*gpu, {9, 2, 16, (4 + 2 * 2) * 16, 4 * 16, true, false}, 23);
}

TEST_CASE("rms_norm on CUDA fused with the residual add: exact stream, norm within 1 ulp", "[gpu][norm]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  for (const int64_t hidden : {64, 576, 4096}) {
    check_norm(*gpu, {7, 1, hidden, hidden, 0, false, true}, 30);
    check_norm(*gpu, {1, 1, hidden, hidden, 0, true, true}, 31);  // out = x, as the final norm
  }
}

TEST_CASE("rms_norm on CUDA: rows 16-byte vectors cannot read take the scalar path", "[gpu][norm]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  check_norm(*gpu, {5, 1, 100, 100, 0, false, false}, 40);   // dim not a multiple of 8
  check_norm(*gpu, {5, 1, 576, 581, 3, false, false}, 41);   // odd stride and offset
  check_norm(*gpu, {4, 3, 24, 81, 1, true, false}, 42);      // per head, misaligned slice
  check_norm(*gpu, {6, 1, 1000, 1003, 3, false, true}, 43);  // fused, misaligned x
}
