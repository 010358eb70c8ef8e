// [gpu] kv_write on the CUDA backend against the CPU op (kv_write_cpu) on the same bf16 K/V
// widened to fp32, into the same junk-filled pool: every byte of both pools (FP8 or bf16), the
// calibrated scales and the saturation counts must be identical - no tolerance. The FP8 bytes
// are x / scale (an IEEE division on both sides) through the one codec (kernels/fp8.hpp, or the
// hardware conversion proven equal to it by test_fp8_codec_gpu), the scales are
// calibrate_kv_scale of the same amax (a max is exact), and a bf16 pool stores the values as
// they are. Shapes: Llama-3-8B / Qwen3 (8 KV heads x 128), SmolLM2 (3 x 64), the tiny fixtures
// (2 x 16); K and V as slices of a fused qkv row.
#include "../attention/attention_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kernels/cpu/kv_write_cpu.hpp"

#include <algorithm>

using namespace fp8serve;
using namespace fp8serve::gpu_test;
using fp8serve::test::BatchArrays;
using fp8serve::test::PoolFixture;
using fp8serve::test::SeqSpec;

namespace {

// A step's batch arrays and the pool's scales copied to the device, and the PagedBatch (device
// pointers) over them.
struct DeviceBatch {
  DeviceBuffer qsl, ctx, slots, calibrate, k_scales, v_scales;
  PagedBatch batch;

  DeviceBatch(Backend& gpu, const BatchArrays& arrays, const PoolFixture& pool)
      : qsl(to_device(gpu, arrays.query_start_loc)), ctx(to_device(gpu, arrays.context_lens)),
        slots(to_device(gpu, arrays.slot_mapping)), calibrate(to_device(gpu, arrays.calibrate)),
        k_scales(to_device(gpu, pool.k_scales)), v_scales(to_device(gpu, pool.v_scales)) {
    batch.num_seqs = pool.num_seqs();
    batch.num_tokens = arrays.query_start_loc.back();
    batch.query_start_loc = qsl.as<int32_t>();
    batch.context_lens = ctx.as<int32_t>();
    batch.slot_mapping = slots.as<int64_t>();
    batch.k_scales = k_scales.as<float>();
    batch.v_scales = v_scales.as<float>();
    batch.calibrate = calibrate.as<uint8_t>();
  }
};

struct KvCase {
  KvDtype dtype = KvDtype::fp8_e4m3;
  int32_t block_size = 16, kv_heads = 8, head_dim = 128;
  std::vector<SeqSpec> seqs;
  std::vector<uint8_t> calibrate;          // [seqs]; empty: calibrate = nullptr
  std::vector<float> k_scales, v_scales;   // frozen scales of the sequences that do not calibrate
  std::vector<int32_t> padding_tokens;     // tokens whose slot is -1
  float margin = 2.0f;
  float sigma = 1.0f;
};

// Runs the case on both backends; returns nothing, checks everything.
void check_kv_write(Backend& gpu, const KvCase& c, std::uint32_t seed) {
  INFO("dtype " << kv_dtype_name(c.dtype) << " heads " << c.kv_heads << " x " << c.head_dim << " seqs "
                << c.seqs.size());
  std::mt19937 rng(seed);
  PoolFixture pool(c.dtype, c.block_size, c.kv_heads, c.head_dim, c.seqs, rng);
  pool.k_scales = c.k_scales;
  pool.v_scales = c.v_scales;
  BatchArrays arrays(pool);
  if (!c.calibrate.empty()) arrays.calibrate = c.calibrate;
  for (const int32_t t : c.padding_tokens) arrays.slot_mapping[static_cast<std::size_t>(t)] = -1;
  const int32_t num_tokens = arrays.query_start_loc.back();
  const int64_t kv_width = static_cast<int64_t>(c.kv_heads) * c.head_dim;
  const int64_t row = 4 * kv_width + 2 * kv_width;  // q (4 query heads per KV head) | k | v
  const std::vector<std::uint16_t> qkv = random_bf16(static_cast<std::size_t>(num_tokens * row), seed + 1, c.sigma);

  // The GPU: everything the op reads on the device.
  DeviceBuffer d_qkv = to_device(gpu, qkv);
  DeviceBuffer d_k = to_device(gpu, pool.k_bytes);
  DeviceBuffer d_v = to_device(gpu, pool.v_bytes);
  DeviceBatch d_batch(gpu, arrays, pool);
  DeviceBuffer d_counts = to_device(gpu, std::vector<KvWriteCounts>(1));
  KvWriteParams p;
  p.k = d_qkv.as<std::uint16_t>() + 4 * kv_width;
  p.v = d_qkv.as<std::uint16_t>() + 5 * kv_width;
  p.k_token_stride = p.v_token_stride = row;
  p.cache = make_paged_kv_view(d_k.data(), d_v.data(), c.dtype, pool.num_blocks, c.block_size, c.kv_heads,
                               c.head_dim);
  p.batch = d_batch.batch;
  if (c.calibrate.empty()) p.batch.calibrate = nullptr;
  p.scale_margin = c.margin;
  p.counts = d_counts.as<KvWriteCounts>();
  gpu.kv_write(p, Stream{});
  const std::vector<uint8_t> gpu_k = to_host<uint8_t>(gpu, d_k, pool.k_bytes.size());
  const std::vector<uint8_t> gpu_v = to_host<uint8_t>(gpu, d_v, pool.v_bytes.size());
  const std::vector<float> gpu_ks = to_host<float>(gpu, d_batch.k_scales, pool.k_scales.size());
  const std::vector<float> gpu_vs = to_host<float>(gpu, d_batch.v_scales, pool.v_scales.size());
  const KvWriteCounts gpu_counts = to_host<KvWriteCounts>(gpu, d_counts, 1)[0];

  // The CPU on the same values (fp32 copies of the bf16 activations), into the same junk.
  const std::vector<float> qkv_f = widen(qkv);
  KvWriteParams ref;
  ref.k = qkv_f.data() + 4 * kv_width;
  ref.v = qkv_f.data() + 5 * kv_width;
  ref.k_token_stride = ref.v_token_stride = row;
  ref.cache = pool.view();
  ref.batch = arrays.batch(pool);
  if (c.calibrate.empty()) ref.batch.calibrate = nullptr;
  ref.scale_margin = c.margin;
  KvWriteCounts cpu_counts;
  ref.counts = &cpu_counts;
  cpu::ThreadPool threads(2);
  cpu::kv_write_cpu(ref, threads);

  CHECK(count_mismatches(gpu_ks, pool.k_scales) == 0);
  CHECK(count_mismatches(gpu_vs, pool.v_scales) == 0);
  CHECK(count_mismatches(gpu_k, pool.k_bytes) == 0);
  CHECK(count_mismatches(gpu_v, pool.v_bytes) == 0);
  CHECK(gpu_counts.num_elements == cpu_counts.num_elements);
  CHECK(gpu_counts.num_k_saturated == cpu_counts.num_k_saturated);
  CHECK(gpu_counts.num_v_saturated == cpu_counts.num_v_saturated);
  INFO("saturated K " << cpu_counts.num_k_saturated << " V " << cpu_counts.num_v_saturated);
}

}  // namespace

TEST_CASE("kv_write on CUDA: FP8 bytes, calibrated scales and counts equal the CPU's", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int32_t chunk = kEmulated ? 37 : 1021;
  // A calibrating prefill chunk, a decode whose frozen scales are too small (it saturates), an
  // empty sequence, a second calibrating chunk with a padding token, a plain decode.
  KvCase c;
  c.seqs = {{chunk, chunk}, {200, 1}, {50, 0}, {23, 23}, {77, 1}};
  c.calibrate = {1, 0, 0, 1, 0};
  c.k_scales = {9.0f, 0.004f, 1.0f, 9.0f, 0.02f};
  c.v_scales = {9.0f, 0.003f, 1.0f, 9.0f, 0.02f};
  c.padding_tokens = {chunk + 1 + 5};
  for (const auto& [heads, dim] : {std::pair{8, 128}, std::pair{3, 64}, std::pair{2, 16}}) {
    c.kv_heads = heads;
    c.head_dim = dim;
    check_kv_write(*gpu, c, 100);
  }
  c.margin = 1.0f;  // the seed's
  c.block_size = 32;
  check_kv_write(*gpu, c, 101);
}

TEST_CASE("kv_write on CUDA: decode steps with no calibration at all (calibrate = null)", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  KvCase c;
  for (int s = 0; s < 9; ++s) {
    c.seqs.push_back({100 + 13 * s, 1});
    c.k_scales.push_back(0.01f * static_cast<float>(s + 1));
    c.v_scales.push_back(0.02f * static_cast<float>(s + 1));
  }
  check_kv_write(*gpu, c, 102);
}

TEST_CASE("kv_write on CUDA into a bf16 pool stores the values as they are", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  KvCase c;
  c.dtype = KvDtype::bf16;
  c.seqs = {{40, 40}, {90, 1}, {5, 5}};
  c.calibrate = {1, 0, 1};  // ignored by a bf16 pool
  c.k_scales = c.v_scales = {1.0f, 1.0f, 1.0f};
  c.padding_tokens = {3};
  for (const auto& [heads, dim] : {std::pair{8, 128}, std::pair{2, 16}}) {
    c.kv_heads = heads;
    c.head_dim = dim;
    check_kv_write(*gpu, c, 103);
  }
}

TEST_CASE("kv_write on CUDA: head dims 16-byte vectors cannot carry take the scalar path", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  KvCase c;
  c.kv_heads = 3;
  c.head_dim = 12;  // a multiple of the FP8 K group (4), not of 8
  c.seqs = {{30, 30}, {61, 1}};
  c.calibrate = {1, 0};
  c.k_scales = {1.0f, 0.003f};
  c.v_scales = {1.0f, 0.5f};
  check_kv_write(*gpu, c, 104);
  c.dtype = KvDtype::bf16;
  check_kv_write(*gpu, c, 105);
}

namespace {

// k_only: a K-only window (tail.v == nullptr), whose V rows all go to their FP8 slots.
void check_window(Backend& gpu, bool k_only, int32_t heads = 8, int32_t dim = 128) {
  INFO((k_only ? "K-only window" : "K and V window") << ", heads " << heads << " x " << dim);
  // Sequence 0: a 40-token first chunk whose positions >= 32 stay in the window; 1: a decode at
  // position 69 inside the window; 2: a decode at 99 already below fp8_lens (the FP8 pool).
  const int32_t bs = 16, ring = 2;
  std::mt19937 rng(7);
  PoolFixture pool(KvDtype::fp8_e4m3, bs, heads, dim, {{40, 40}, {70, 1}, {100, 1}}, rng);
  pool.k_scales = {5.0f, 0.01f, 0.02f};
  pool.v_scales = {5.0f, 0.01f, 0.02f};
  BatchArrays arrays(pool);
  arrays.calibrate = {1, 0, 0};
  const std::vector<int32_t> fp8_lens{32, 64, 100}, tail_slots{1, 0, 2};
  const int32_t tail_blocks = 3 * ring;
  const int32_t num_tokens = arrays.query_start_loc.back();
  const int64_t row = static_cast<int64_t>(heads) * dim;
  const std::vector<std::uint16_t> k = random_bf16(static_cast<std::size_t>(num_tokens * row), 8, 2.0f);
  const std::vector<std::uint16_t> v = random_bf16(k.size(), 9, 2.0f);
  std::vector<std::uint16_t> tail_k(static_cast<std::size_t>(tail_blocks) * bs * row), tail_v(tail_k.size());
  for (auto* t : {&tail_k, &tail_v})
    for (std::uint16_t& x : *t) x = static_cast<std::uint16_t>(rng());

  DeviceBuffer d_k = to_device(gpu, k), d_v = to_device(gpu, v);
  DeviceBuffer d_pk = to_device(gpu, pool.k_bytes), d_pv = to_device(gpu, pool.v_bytes);
  DeviceBuffer d_tk = to_device(gpu, tail_k), d_tv = to_device(gpu, tail_v);
  DeviceBatch d_batch(gpu, arrays, pool);
  DeviceBuffer d_fp8 = to_device(gpu, fp8_lens), d_ring = to_device(gpu, tail_slots);
  DeviceBuffer d_counts = to_device(gpu, std::vector<KvWriteCounts>(1));
  KvWriteParams p;
  p.k = d_k.data();
  p.v = d_v.data();
  p.cache = make_paged_kv_view(d_pk.data(), d_pv.data(), KvDtype::fp8_e4m3, pool.num_blocks, bs, heads, dim);
  p.tail = make_paged_kv_view(d_tk.data(), k_only ? nullptr : d_tv.data(), KvDtype::bf16, tail_blocks, bs, heads, dim);
  p.batch = d_batch.batch;
  p.batch.fp8_lens = d_fp8.as<int32_t>();
  p.batch.tail_slots = d_ring.as<int32_t>();
  p.batch.tail_ring_blocks = ring;
  p.counts = d_counts.as<KvWriteCounts>();
  gpu.kv_write(p, Stream{});

  // Reference for the FP8 pool, the scales and the counts: the CPU op with the tail-bound tokens
  // as padding (calibration still sees the whole chunk, as the contract says).
  std::vector<int32_t> to_tail;
  for (int32_t s = 0, t = 0; s < 3; ++s) {
    const SeqSpec spec = pool.seqs[static_cast<std::size_t>(s)];
    for (int32_t i = 0; i < spec.num_new; ++i, ++t) {
      if (spec.context_len - spec.num_new + i >= fp8_lens[static_cast<std::size_t>(s)]) to_tail.push_back(t);
    }
  }
  REQUIRE(to_tail.size() == 9);  // 8 of the chunk, the decode of sequence 1
  BatchArrays cpu_arrays = arrays;
  for (const int32_t t : to_tail) cpu_arrays.slot_mapping[static_cast<std::size_t>(t)] = -1;
  // A K-only window writes the tail tokens' V to their FP8 slots too: the CPU op does that with
  // the K written (and then restored) alongside; calibration has happened by then.
  std::vector<uint8_t> k_before_tail_v;
  const std::vector<float> kf = widen(k), vf = widen(v);
  KvWriteParams ref;
  ref.k = kf.data();
  ref.v = vf.data();
  ref.cache = pool.view();
  ref.batch = cpu_arrays.batch(pool);
  KvWriteCounts cpu_counts;
  ref.counts = &cpu_counts;
  cpu::ThreadPool threads(1);
  cpu::kv_write_cpu(ref, threads);
  if (k_only) {
    KvWriteParams v_ref = ref;
    BatchArrays v_arrays = arrays;  // only the tail tokens, with their FP8 slots
    for (std::size_t t = 0; t < v_arrays.slot_mapping.size(); ++t)
      if (std::find(to_tail.begin(), to_tail.end(), static_cast<int32_t>(t)) == to_tail.end()) v_arrays.slot_mapping[t] = -1;
    v_arrays.calibrate = {0, 0, 0};
    v_ref.batch = v_arrays.batch(pool);
    k_before_tail_v = pool.k_bytes;
    KvWriteCounts v_counts;
    v_ref.counts = &v_counts;
    cpu::kv_write_cpu(v_ref, threads);
    pool.k_bytes = k_before_tail_v;  // that pass's K writes are the tail's, not the pool's
    cpu_counts.num_v_saturated += v_counts.num_v_saturated;
  }
  // The tail: bf16 bits at tail_slot(s, pos), through the tail view's own layout.
  PagedBatch host_batch;
  host_batch.tail_slots = tail_slots.data();
  host_batch.tail_ring_blocks = ring;
  const PagedKvView tail_view = make_paged_kv_view(tail_k.data(), tail_v.data(), KvDtype::bf16, tail_blocks, bs, heads, dim);
  std::vector<std::uint16_t> expect_tk = tail_k, expect_tv = tail_v;
  for (const int32_t t : to_tail) {
    const int32_t s = t < 40 ? 0 : 1;
    const SeqSpec spec = pool.seqs[static_cast<std::size_t>(s)];
    const int32_t pos = spec.context_len - spec.num_new + (t - arrays.query_start_loc[static_cast<std::size_t>(s)]);
    const int64_t slot = host_batch.tail_slot(s, pos, bs);
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t d = 0; d < dim; ++d) {
        const std::size_t src = static_cast<std::size_t>(t * row + h * dim + d);
        expect_tk[static_cast<std::size_t>(tail_view.k_offset(slot, h, d))] = k[src];
        if (!k_only) expect_tv[static_cast<std::size_t>(tail_view.v_offset(slot, h) + d)] = v[src];
      }
    }
  }
  CHECK(count_mismatches(to_host<float>(gpu, d_batch.k_scales, 3), pool.k_scales) == 0);
  CHECK(count_mismatches(to_host<float>(gpu, d_batch.v_scales, 3), pool.v_scales) == 0);
  CHECK(count_mismatches(to_host<uint8_t>(gpu, d_pk, pool.k_bytes.size()), pool.k_bytes) == 0);
  CHECK(count_mismatches(to_host<uint8_t>(gpu, d_pv, pool.v_bytes.size()), pool.v_bytes) == 0);
  CHECK(count_mismatches(to_host<std::uint16_t>(gpu, d_tk, tail_k.size()), expect_tk) == 0);
  CHECK(count_mismatches(to_host<std::uint16_t>(gpu, d_tv, tail_v.size()), expect_tv) == 0);
  const KvWriteCounts got = to_host<KvWriteCounts>(gpu, d_counts, 1)[0];  // the main pool's rows only
  CHECK(got.num_elements == cpu_counts.num_elements);
  CHECK(got.num_k_saturated == cpu_counts.num_k_saturated);
  CHECK(got.num_v_saturated == cpu_counts.num_v_saturated);
}

}  // namespace

TEST_CASE("kv_write on CUDA with the bf16 window: old positions to FP8 slots, recent ones to the tail", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  check_window(*gpu, false);
  check_window(*gpu, true);
  check_window(*gpu, false, 3, 12);  // the element-at-a-time path
  check_window(*gpu, true, 3, 12);
}

TEST_CASE("kv_write on CUDA: a slot outside the pool is reported and not written", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  std::mt19937 rng(9);
  PoolFixture pool(KvDtype::fp8_e4m3, 16, 2, 16, {{3, 3}}, rng);
  BatchArrays arrays(pool);
  arrays.slot_mapping[1] = static_cast<int64_t>(pool.num_blocks) * 16;  // one past the end
  const std::vector<std::uint16_t> kv = random_bf16(3 * 32, 10);
  DeviceBuffer d_kv = to_device(*gpu, kv), d_pk = to_device(*gpu, pool.k_bytes), d_pv = to_device(*gpu, pool.v_bytes);
  DeviceBatch d_batch(*gpu, arrays, pool);
  KvWriteParams p;
  p.k = p.v = d_kv.data();
  p.cache = make_paged_kv_view(d_pk.data(), d_pv.data(), KvDtype::fp8_e4m3, pool.num_blocks, 16, 2, 16);
  p.batch = d_batch.batch;
  p.batch.calibrate = nullptr;
  gpu->kv_write(p, Stream{});
  CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
  CHECK_NOTHROW(gpu->synchronize(Stream{}));
}
