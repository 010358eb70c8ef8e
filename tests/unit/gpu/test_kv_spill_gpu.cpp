// [gpu] kv_spill on the GPU (kernels/kv_spill.hpp): positions leaving the bf16 window move from
// the tail into their FP8 slots. The reference is a plain loop over the contract - each spilled
// element is fp8_e4m3_encode(bf16 tail value / scale) at the slot the sequence's block table
// gives, found with the test fixture's own layout arithmetic - so every byte of the pool and
// every count must match exactly. Other bytes stay as they were, including every sequence whose
// range is empty. Once the bf16 window's branch is merged, its CPU kv_spill is a second
// reference.
#include "../attention/attention_test_util.hpp"
#include "cuda_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;
using fp8serve::test::PoolFixture;

namespace {

void check_spill(Backend& gpu, int32_t heads, int32_t dim, bool k_only, std::uint32_t seed) {
  INFO("heads " << heads << " x " << dim << (k_only ? " K-only window" : ""));
  const int32_t bs = 16, ring = 4;
  std::mt19937 rng(seed);
  // {context_len, num_new}: spills [16, 48), nothing, [0, 16), [5, 9) (a partial block).
  PoolFixture pool(KvDtype::fp8_e4m3, bs, heads, dim, {{60, 1}, {40, 1}, {20, 4}, {9, 0}}, rng);
  pool.k_scales = {0.001f, 1.0f, 0.5f, 0.02f};
  pool.v_scales = {0.02f, 1.0f, 0.25f, 0.002f};
  const std::vector<int32_t> starts{16, 32, 0, 5}, fp8_lens{48, 32, 16, 9}, tail_slots{2, 0, 3, 1};
  std::vector<int32_t> qsl{0}, ctx;
  for (const auto& s : pool.seqs) {
    qsl.push_back(qsl.back() + s.num_new);
    ctx.push_back(s.context_len);
  }
  const int32_t tail_blocks = 4 * ring;
  const std::size_t tail_elems = static_cast<std::size_t>(tail_blocks) * bs * heads * dim;
  const std::vector<std::uint16_t> tail_k = random_bf16(tail_elems, seed + 1, 1.0f);
  const std::vector<std::uint16_t> tail_v = random_bf16(tail_elems, seed + 2, 1.0f);

  DeviceBuffer d_k = to_device(gpu, pool.k_bytes), d_v = to_device(gpu, pool.v_bytes);
  DeviceBuffer d_tk = to_device(gpu, tail_k), d_tv = to_device(gpu, tail_v);
  DeviceBuffer d_qsl = to_device(gpu, qsl), d_ctx = to_device(gpu, ctx), d_tables = to_device(gpu, pool.block_tables);
  DeviceBuffer d_ks = to_device(gpu, pool.k_scales), d_vs = to_device(gpu, pool.v_scales);
  DeviceBuffer d_starts = to_device(gpu, starts), d_fp8 = to_device(gpu, fp8_lens), d_ring = to_device(gpu, tail_slots);
  DeviceBuffer d_counts = to_device(gpu, std::vector<KvWriteCounts>(1));
  KvSpillParams p;
  p.cache = make_paged_kv_view(d_k.data(), d_v.data(), KvDtype::fp8_e4m3, pool.num_blocks, bs, heads, dim);
  p.tail = make_paged_kv_view(d_tk.data(), k_only ? nullptr : d_tv.data(), KvDtype::bf16, tail_blocks, bs, heads, dim);
  p.batch.num_seqs = pool.num_seqs();
  p.batch.num_tokens = qsl.back();
  p.batch.query_start_loc = d_qsl.as<int32_t>();
  p.batch.context_lens = d_ctx.as<int32_t>();
  p.batch.block_tables = d_tables.as<int32_t>();
  p.batch.max_blocks_per_seq = pool.max_blocks_per_seq;
  p.batch.k_scales = d_ks.as<float>();
  p.batch.v_scales = d_vs.as<float>();
  p.batch.fp8_lens = d_fp8.as<int32_t>();
  p.batch.tail_slots = d_ring.as<int32_t>();
  p.batch.tail_ring_blocks = ring;
  p.spill_starts = d_starts.as<int32_t>();
  p.max_spill_tokens = 32;
  p.counts = d_counts.as<KvWriteCounts>();
  gpu.kv_spill(p, Stream{});

  // The contract as a loop.
  std::vector<uint8_t> k_expect = pool.k_bytes, v_expect = pool.v_bytes;
  PagedBatch host;
  host.tail_slots = tail_slots.data();
  host.tail_ring_blocks = ring;
  const PagedKvView tail_view = make_paged_kv_view(nullptr, nullptr, KvDtype::bf16, tail_blocks, bs, heads, dim);
  KvWriteCounts expect;
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const int32_t end = std::min(fp8_lens[static_cast<std::size_t>(s)], ctx[static_cast<std::size_t>(s)] - pool.seqs[static_cast<std::size_t>(s)].num_new);
    for (int32_t pos = starts[static_cast<std::size_t>(s)]; pos < end; ++pos) {
      const int64_t from = host.tail_slot(s, pos, bs);
      for (int32_t h = 0; h < heads; ++h) {
        for (int32_t d = 0; d < dim; ++d) {
          const float yk = bf16_decode(tail_k[static_cast<std::size_t>(tail_view.k_offset(from, h, d))]) / pool.k_scales[static_cast<std::size_t>(s)];
          k_expect[static_cast<std::size_t>(pool.k_index(s, pos, h, d))] = fp8_e4m3_encode(yk);
          expect.num_k_saturated += std::fabs(yk) > 464.0f;
          if (k_only) continue;
          const float yv = bf16_decode(tail_v[static_cast<std::size_t>(tail_view.v_offset(from, h) + d)]) / pool.v_scales[static_cast<std::size_t>(s)];
          v_expect[static_cast<std::size_t>(pool.v_index(s, pos, h, d))] = fp8_e4m3_encode(yv);
          expect.num_v_saturated += std::fabs(yv) > 464.0f;
        }
      }
      expect.num_elements += static_cast<uint64_t>(heads) * dim;
    }
  }
  const KvWriteCounts got = to_host<KvWriteCounts>(gpu, d_counts, 1)[0];
  CHECK(count_mismatches(to_host<uint8_t>(gpu, d_k, pool.k_bytes.size()), k_expect) == 0);
  CHECK(count_mismatches(to_host<uint8_t>(gpu, d_v, pool.v_bytes.size()), v_expect) == 0);
  CHECK(got.num_elements == expect.num_elements);
  CHECK(got.num_k_saturated == expect.num_k_saturated);
  CHECK(got.num_v_saturated == expect.num_v_saturated);
  CHECK(expect.num_k_saturated > 0);  // sequence 0: |x| > 464 * 0.001 is common in N(0, 1)
}

}  // namespace

TEST_CASE("kv_spill on CUDA quantizes the positions leaving the window into their FP8 slots", "[gpu][kv_spill]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  check_spill(*gpu, 8, 128, false, 1);
  check_spill(*gpu, 2, 16, false, 2);
  check_spill(*gpu, 8, 128, true, 3);   // K-only window: V is already in the pool
  check_spill(*gpu, 3, 12, false, 4);   // the element-at-a-time path
}
