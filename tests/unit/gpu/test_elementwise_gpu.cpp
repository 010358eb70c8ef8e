// [gpu] The CUDA backend's small ops against the CPU ops on the same bf16 values: SiLU·mul on
// the halves of a fused gate_up row (Llama-3-8B 14336, Qwen3-0.6B 3072, SmolLM2 1536), the
// residual add, the embedding lookup and gather_rows (bit copies on the GPU), copy_blocks.
//
// Tolerances: the residual add and the copies are exact (fp32 sum of two bf16 values, rounded
// once on both sides; bits moved unchanged). SiLU·mul: 1 bf16 ulp - the device's expf is within
// 2 fp32 ulps of the host's, which can move the product across a bf16 rounding boundary only
// when it lies within ~2^-22 relative of one.
#include <numeric>

#include "cuda_test_util.hpp"
#include "kernels/cpu/ops.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

TEST_CASE("silu_mul on CUDA matches the CPU op within 1 bf16 ulp", "[gpu][elementwise]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  for (const int64_t inter : {1536, 3072, 14336, 100}) {  // 100: the element-at-a-time path
    const int64_t tokens = kEmulated ? 3 : 65;
    INFO("intermediate " << inter);
    const std::vector<std::uint16_t> gate_up = random_bf16(static_cast<std::size_t>(tokens * 2 * inter), 7, 3.0f);
    DeviceBuffer d = to_device(*gpu, gate_up);
    SiluMulParams p;
    p.gate = d.data();
    p.up = d.as<std::uint16_t>() + inter;
    p.out = d.data();  // in place over gate, as the forward pass does
    p.num_tokens = tokens;
    p.dim = inter;
    p.gate_token_stride = p.up_token_stride = p.out_token_stride = 2 * inter;
    gpu->silu_mul(p, Stream{});
    const std::vector<std::uint16_t> got = to_host<std::uint16_t>(*gpu, d, gate_up.size());

    std::vector<float> expected = widen(gate_up);
    cpu::ThreadPool pool(1);
    SiluMulParams ref = p;
    ref.gate = expected.data();
    ref.up = expected.data() + inter;
    ref.out = expected.data();
    cpu::silu_mul_cpu(ref, pool);
    const UlpReport r = compare_bf16(got, expected, 1);
    CHECK(r.beyond == 0);
    CHECK(r.differ <= gate_up.size() / 100 + 1);
  }
}

TEST_CASE("residual_add on CUDA is the CPU's fp32 sum rounded once", "[gpu][elementwise]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  for (const int64_t n : {int64_t{4096} * 5, int64_t{576} * 3 + 1}) {
    const std::vector<std::uint16_t> residual = random_bf16(static_cast<std::size_t>(n), 8, 4.0f);
    const std::vector<std::uint16_t> x = random_bf16(static_cast<std::size_t>(n), 9, 1.0f);
    DeviceBuffer d_r = to_device(*gpu, residual);
    DeviceBuffer d_x = to_device(*gpu, x);
    ResidualAddParams p;
    p.residual = d_r.data();
    p.x = d_x.data();
    p.num_elements = n;
    gpu->residual_add(p, Stream{});
    std::vector<float> expected = widen(residual);
    const std::vector<float> xf = widen(x);
    cpu::ThreadPool pool(1);
    cpu::residual_add_cpu({expected.data(), xf.data(), n}, pool);
    CHECK(count_mismatches(to_host<std::uint16_t>(*gpu, d_r, residual.size()), narrow(expected)) == 0);
  }
}

TEST_CASE("embedding and gather_rows on CUDA copy rows bit for bit and report bad indices", "[gpu][elementwise]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t vocab = 1000, hidden = 576;
  const std::vector<std::uint16_t> table = random_bf16(static_cast<std::size_t>(vocab * hidden), 10);
  const std::vector<int32_t> ids{0, 999, 17, 17, 512, 3, 998};
  DeviceBuffer d_table = to_device(*gpu, table);
  DeviceBuffer d_ids = to_device(*gpu, ids);
  DeviceBuffer d_out(*gpu, ids.size() * hidden * sizeof(std::uint16_t));
  EmbeddingParams e;
  e.table = d_table.as<std::uint16_t>();
  e.token_ids = d_ids.as<int32_t>();
  e.out = d_out.data();
  e.num_tokens = static_cast<int64_t>(ids.size());
  e.vocab_size = vocab;
  e.hidden = hidden;
  gpu->embedding(e, Stream{});
  const std::vector<std::uint16_t> embedded = to_host<std::uint16_t>(*gpu, d_out, ids.size() * hidden);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    INFO("token " << t);
    CHECK(std::equal(embedded.begin() + static_cast<std::ptrdiff_t>(t * hidden),
                     embedded.begin() + static_cast<std::ptrdiff_t>((t + 1) * hidden),
                     table.begin() + static_cast<std::ptrdiff_t>(ids[t] * hidden)));
  }

  // gather_rows: rows 6, 0, 6 of the embedded tokens.
  const std::vector<int32_t> rows{6, 0, 6};
  DeviceBuffer d_rows = to_device(*gpu, rows);
  DeviceBuffer d_sampled(*gpu, rows.size() * hidden * sizeof(std::uint16_t));
  GatherRowsParams g;
  g.x = d_out.data();
  g.rows = d_rows.as<int32_t>();
  g.out = d_sampled.data();
  g.num_x_rows = static_cast<int64_t>(ids.size());
  g.num_rows = static_cast<int64_t>(rows.size());
  g.dim = hidden;
  gpu->gather_rows(g, Stream{});
  const std::vector<std::uint16_t> sampled = to_host<std::uint16_t>(*gpu, d_sampled, rows.size() * hidden);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CHECK(std::equal(sampled.begin() + static_cast<std::ptrdiff_t>(i * hidden),
                     sampled.begin() + static_cast<std::ptrdiff_t>((i + 1) * hidden),
                     embedded.begin() + static_cast<std::ptrdiff_t>(rows[i] * hidden)));
  }

  SECTION("an id outside the vocabulary zeroes its row and throws at synchronize") {
    gpu->copy_to_device(d_ids.data(), std::vector<int32_t>{5, static_cast<int32_t>(vocab)}.data(), 2 * sizeof(int32_t), Stream{});
    e.num_tokens = 2;
    gpu->embedding(e, Stream{});
    CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
    const std::vector<std::uint16_t> out = to_host<std::uint16_t>(*gpu, d_out, 2 * hidden);
    CHECK(std::all_of(out.begin() + hidden, out.end(), [](std::uint16_t v) { return v == 0; }));
    CHECK(std::equal(out.begin(), out.begin() + hidden, table.begin() + 5 * hidden));
  }
  SECTION("a row outside the tensor is reported too") {
    gpu->copy_to_device(d_rows.data(), std::vector<int32_t>{-1}.data(), sizeof(int32_t), Stream{});
    g.num_rows = 1;
    gpu->gather_rows(g, Stream{});
    CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
    CHECK_NOTHROW(gpu->synchronize(Stream{}));
  }
}

TEST_CASE("copy_blocks on CUDA copies every layer's K and V block and nothing else", "[gpu][elementwise]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  for (const KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    const int32_t num_layers = 3, num_blocks = 6, block_size = 16, kv_heads = 8, head_dim = 128;
    const std::size_t pool_bytes =
        static_cast<std::size_t>(num_blocks) * block_size * kv_heads * head_dim * kv_dtype_size(dtype);
    std::vector<std::vector<std::uint8_t>> host;
    std::vector<DeviceBuffer> buffers;
    std::vector<PagedKvView> views;
    std::mt19937 rng(11);
    for (int32_t l = 0; l < num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<std::uint8_t> bytes(pool_bytes);
        for (std::uint8_t& b : bytes) b = static_cast<std::uint8_t>(rng());
        buffers.push_back(to_device(*gpu, bytes));
        host.push_back(std::move(bytes));
      }
      views.push_back(make_paged_kv_view(buffers[2 * l].data(), buffers[2 * l + 1].data(), dtype, num_blocks,
                                         block_size, kv_heads, head_dim));
    }
    const std::vector<int32_t> src{1, 4, 0}, dst{5, 2, 3};
    CopyBlocksParams p;
    p.layers = views.data();
    p.num_layers = num_layers;
    p.src = src.data();
    p.dst = dst.data();
    p.num_copies = static_cast<int32_t>(src.size());
    gpu->copy_blocks(p, Stream{});
    const std::size_t block_bytes = pool_bytes / num_blocks;
    for (std::size_t i = 0; i < host.size(); ++i) {
      std::vector<std::uint8_t> expected = host[i];
      for (std::size_t c = 0; c < src.size(); ++c) {
        std::copy_n(host[i].begin() + static_cast<std::ptrdiff_t>(src[c] * block_bytes), block_bytes,
                    expected.begin() + static_cast<std::ptrdiff_t>(dst[c] * block_bytes));
      }
      CHECK(count_mismatches(to_host<std::uint8_t>(*gpu, buffers[i], pool_bytes), expected) == 0);
    }
    const std::vector<int32_t> bad{num_blocks};
    p.src = bad.data();
    p.num_copies = 1;
    CHECK_THROWS_AS(gpu->copy_blocks(p, Stream{}), std::out_of_range);
  }
}
