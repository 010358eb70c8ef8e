// [gpu] What the CUDA host launchers refuse before they launch anything (std::invalid_argument, a
// message naming the rule), each from one valid call with one field made wrong: paged attention
// (its views, shapes, batch, tail and workspace), kv_write, kv_spill, rms_norm and rope; plus
// the device-side check of kv_spill (a block table entry outside the pool is reported, not
// followed) and the launchers' rarely taken paths: add_bias_f32 (cuBLASLt's fp32-output bias) and
// gather_rows over rows that 16-byte vectors cannot read. The valid calls run and their results
// are checked, so a check that refused everything would fail too.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda_test_util.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/ops_cuda.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"

using namespace fp8serve;
using namespace fp8serve::gpu_test;

namespace {

// What `call` throws must be std::invalid_argument naming `words`.
template <class Call>
void check_refused(const Call& call, const std::string& words) {
  INFO("expected a refusal naming: " << words);
  try {
    call();
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find(words) != std::string::npos);
    UNSCOPED_INFO(e.what());
  }
}

// `valid` changed by `change` must make `call` throw std::invalid_argument naming `words`.
template <class Params, class Change, class Call>
void check_refused(const Params& valid, const Change& change, const Call& call, const std::string& words) {
  Params bad = valid;
  change(bad);
  check_refused([&] { call(bad); }, words);
}

// One decode token of 4 query heads over 2 KV heads (head_dim 64), one sequence of 3 tokens in
// block 1 of a bf16 pool of 2 blocks whose V is all 1.0: the output is 1.0 wherever the
// probabilities go. K is 0, so the scores are equal.
struct AttentionCall {
  static constexpr int32_t kHeads = 4, kKvHeads = 2, kDim = 64, kBlock = 16, kBlocks = 2;
  std::unique_ptr<Backend>& gpu;
  DeviceBuffer k, v, q, out, starts, lens, table, scales, workspace;
  PagedAttentionParams p;
  std::size_t workspace_bytes = 0;

  explicit AttentionCall(std::unique_ptr<Backend>& backend) : gpu(backend) {
    const std::size_t pool = std::size_t{kBlocks} * kBlock * kKvHeads * kDim;
    k = to_device(*gpu, std::vector<std::uint16_t>(pool, 0));
    v = to_device(*gpu, std::vector<std::uint16_t>(pool, bf16_encode(1.0f)));
    q = to_device(*gpu, random_bf16(kHeads * kDim, 3));
    out = to_device(*gpu, std::vector<std::uint16_t>(kHeads * kDim, 0));
    starts = to_device(*gpu, std::vector<int32_t>{0, 1});
    lens = to_device(*gpu, std::vector<int32_t>{3});
    table = to_device(*gpu, std::vector<int32_t>{1});
    scales = to_device(*gpu, std::vector<float>{1.0f});
    p.q = q.data();
    p.out = out.data();
    p.num_heads = kHeads;
    p.softmax_scale = 0.125f;
    p.cache = make_paged_kv_view(k.data(), v.data(), KvDtype::bf16, kBlocks, kBlock, kKvHeads, kDim);
    p.batch.num_seqs = 1;
    p.batch.num_tokens = 1;
    p.batch.query_start_loc = starts.as<int32_t>();
    p.batch.context_lens = lens.as<int32_t>();
    p.batch.block_tables = table.as<int32_t>();
    p.batch.max_blocks_per_seq = 1;
    cuda::PagedAttentionCudaLimits limits;
    limits.max_num_seqs = 1;
    limits.num_heads = kHeads;
    limits.num_kv_heads = kKvHeads;
    limits.head_dim = kDim;
    workspace_bytes = cuda::paged_attention_cuda_workspace_bytes(limits);
    workspace = DeviceBuffer(*gpu, workspace_bytes);
    gpu->synchronize(Stream{});  // the uploads ran on the backend's stream; the calls use the legacy one
  }
  void run(const PagedAttentionParams& params, void* ws, std::size_t bytes,
           const cuda::PagedAttentionCudaOptions& options = {}) const {
    cuda::paged_attention_cuda(params, ws, bytes, nullptr, options);
  }
  void run(const PagedAttentionParams& params) const { run(params, workspace.data(), workspace_bytes); }
};

// A zeroed FP8 pool of `blocks` blocks (16 tokens x 2 KV heads x 16) and one sequence of
// `context_len` tokens, one of them new, with unit scales: the valid kv_write / kv_spill call
// the tests change.
struct OneSequencePool {
  static constexpr int32_t kBlockSize = 16, kHeads = 2, kDim = 16;
  std::size_t pool_bytes;
  DeviceBuffer k, v, starts, lens, scales;
  PagedKvView cache;
  PagedBatch batch;
  OneSequencePool(Backend& gpu, int32_t blocks, int32_t context_len)
      : pool_bytes(static_cast<std::size_t>(blocks) * kBlockSize * kHeads * kDim),
        k(to_device(gpu, std::vector<std::uint8_t>(pool_bytes, 0))),
        v(to_device(gpu, std::vector<std::uint8_t>(pool_bytes, 0))),
        starts(to_device(gpu, std::vector<int32_t>{0, 1})),
        lens(to_device(gpu, std::vector<int32_t>{context_len})),
        scales(to_device(gpu, std::vector<float>{1.0f})) {
    cache = make_paged_kv_view(k.data(), v.data(), KvDtype::fp8_e4m3, blocks, kBlockSize, kHeads, kDim);
    batch.num_seqs = 1;
    batch.num_tokens = 1;
    batch.query_start_loc = starts.as<int32_t>();
    batch.context_lens = lens.as<int32_t>();
    batch.k_scales = batch.v_scales = scales.as<float>();
  }
};

}  // namespace

TEST_CASE("paged_attention_cuda refuses bad views, shapes, batches and workspaces", "[gpu][attention]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const AttentionCall call(gpu);
  call.run(call.p);
  CUDA_CHECK(cudaDeviceSynchronize());
  for (std::uint16_t bits : to_host<std::uint16_t>(*gpu, call.out, AttentionCall::kHeads * AttentionCall::kDim))
    REQUIRE(bf16_decode(bits) == 1.0f);

  using P = PagedAttentionParams;
  const auto run = [&](const P& p) { call.run(p); };
  const P& valid = call.p;
  void* const k = call.k.data();
  void* const v = call.v.data();
  check_refused(valid, [](P& p) { p.cache.dtype = static_cast<KvDtype>(7); }, run, "unsupported KV dtype");
  check_refused(valid, [](P& p) { p.cache.v = nullptr; }, run, "null K or V");
  check_refused(valid, [](P& p) { p.cache.num_blocks = 0; }, run, "no blocks");
  check_refused(valid, [&](P& p) { p.cache = make_paged_kv_view(k, v, KvDtype::bf16, 2, 12, 2, 64); }, run,
                "block_size must be 8, 16 or 32");
  check_refused(valid, [](P& p) { p.cache.v_token_stride = 63; }, run, "strides must be positive");
  check_refused(valid, [](P& p) { p.cache.v_token_stride = int64_t{1} << 27; }, run, "span more than 2 GiB");
  check_refused(valid, [&](P& p) { p.cache.k = call.k.as<std::uint16_t>() + 1; }, run, "16-byte aligned");
  check_refused(valid, [](P& p) { p.num_heads = 3; }, run, "positive multiple of num_kv_heads");
  check_refused(valid, [](P& p) { p.num_heads = 2 * 65; }, run, "more than 64 query heads");
  for (int32_t dim : {8, 72, 272}) {
    check_refused(valid, [&](P& p) { p.cache = make_paged_kv_view(k, v, KvDtype::bf16, 2, 16, 2, dim); }, run,
                  "head_dim " + std::to_string(dim) + " is not a multiple of 16 in [16, 256]");
  }
  check_refused(valid, [](P& p) { p.batch.num_tokens = 0; }, run, "num_tokens must be >= num_seqs");
  check_refused(valid, [](P& p) { p.batch.block_tables = nullptr; }, run,
                "null query_start_loc, context_lens or block_tables");
  check_refused(valid, [](P& p) { p.batch.max_blocks_per_seq = 0; }, run, "max_blocks_per_seq must be >= 1");
  check_refused(valid, [](P& p) { p.cache.dtype = KvDtype::fp8_e4m3; }, run, "an FP8 pool needs k_scales and v_scales");
  check_refused(valid, [](P& p) { p.out = nullptr; }, run, "null q or out");
  check_refused(valid, [](P& p) { p.q_token_stride = AttentionCall::kHeads * AttentionCall::kDim - 1; }, run,
                "a token stride (not 0) < num_heads * head_dim");
  check_refused(valid, [](P& p) { p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); }, run,
                "softmax_scale must be finite");

  // The bf16 window's tail: the cache's geometry, in bf16, with its ring.
  const DeviceBuffer fp8_lens = to_device(*gpu, std::vector<int32_t>{0});
  const DeviceBuffer tail_slots = to_device(*gpu, std::vector<int32_t>{0});
  P window = call.p;
  window.cache.dtype = KvDtype::fp8_e4m3;
  window.batch.k_scales = window.batch.v_scales = call.scales.as<float>();
  window.batch.fp8_lens = fp8_lens.as<int32_t>();
  window.batch.tail_slots = tail_slots.as<int32_t>();
  window.batch.tail_ring_blocks = 1;
  window.tail = make_paged_kv_view(k, v, KvDtype::bf16, 2, 16, 2, 64);
  gpu->synchronize(Stream{});
  CHECK_NOTHROW(call.run(window));
  CUDA_CHECK(cudaDeviceSynchronize());
  check_refused(window, [&](P& p) { p.tail = make_paged_kv_view(k, v, KvDtype::bf16, 2, 8, 2, 64); }, run,
                "the tail pool must be bf16 with the cache's block_size");
  check_refused(window, [](P& p) { p.batch.tail_ring_blocks = 0; }, run,
                "the tail needs tail_slots and tail_ring_blocks >= 1");

  // The workspace: present, aligned, large enough for the batch and for forced partitions.
  check_refused([&] { call.run(call.p, nullptr, call.workspace_bytes); }, "workspace missing");
  check_refused([&] { call.run(call.p, call.workspace.as<char>() + 4, call.workspace_bytes - 16); },
                "workspace missing");
  check_refused([&] { call.run(call.p, call.workspace.data(), 64); }, "workspace missing");
  cuda::PagedAttentionCudaOptions tiny_partitions;
  tiny_partitions.partition_tokens = 1;
  PagedAttentionParams long_context = call.p;
  long_context.batch.max_blocks_per_seq = 1 << 20;  // read by the plan's bound, not by the kernel here
  check_refused([&] { call.run(long_context, call.workspace.data(), call.workspace_bytes, tiny_partitions); },
                "partition_tokens too small for the workspace");
  PagedAttentionParams more_seqs = call.p;
  more_seqs.batch.num_seqs = more_seqs.batch.num_tokens = 4096;  // its plan fits, one slot each does not
  check_refused([&] { call.run(more_seqs); }, "workspace too small for 4096 sequences");

  cuda::PagedAttentionCudaLimits limits;
  limits.max_num_seqs = 0;
  limits.num_heads = 4;
  limits.num_kv_heads = 2;
  limits.head_dim = 64;
  check_refused([&] { cuda::paged_attention_cuda_workspace_bytes(limits); }, "max_num_seqs < 1");
  limits.max_num_seqs = 1;
  limits.head_dim = 100;
  check_refused([&] { cuda::paged_attention_cuda_workspace_bytes(limits); }, "head_dim 100");
}

TEST_CASE("kv_write on CUDA refuses bad views and batches", "[gpu][kv_write]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const OneSequencePool pool(*gpu, 2, 1);
  const int32_t heads = OneSequencePool::kHeads, dim = OneSequencePool::kDim;
  DeviceBuffer x = to_device(*gpu, std::vector<std::uint16_t>(heads * dim, bf16_encode(2.0f)));
  DeviceBuffer slots = to_device(*gpu, std::vector<int64_t>{0});
  KvWriteParams p;
  p.k = p.v = x.data();
  p.cache = pool.cache;
  p.batch = pool.batch;
  p.batch.slot_mapping = slots.as<int64_t>();
  gpu->kv_write(p, Stream{});
  const std::vector<std::uint8_t> written = to_host<std::uint8_t>(*gpu, pool.k, pool.pool_bytes);
  CHECK(written[0] == fp8_e4m3_encode(2.0f));  // slot 0, head 0, element 0

  using P = KvWriteParams;
  const auto run = [&](const P& bad) { gpu->kv_write(bad, Stream{}); };
  check_refused(p, [](P& q) { q.cache.num_blocks = 0; }, run, "bad cache view");
  check_refused(p, [](P& q) { q.batch.num_seqs = 0; }, run, "bad batch");
  check_refused(p, [](P& q) { q.k = nullptr; }, run, "null k/v/slot_mapping");
  check_refused(p, [&](P& q) { q.k_token_stride = heads * dim - 1; }, run, "null k/v/slot_mapping or token stride");
  check_refused(p, [](P& q) { q.batch.v_scales = nullptr; }, run, "FP8 pool needs k_scales and v_scales");
  // A window needs an FP8 pool, and a tail of the pool's geometry with its ring.
  const DeviceBuffer fp8_lens = to_device(*gpu, std::vector<int32_t>{0}), ring = to_device(*gpu, std::vector<int32_t>{0});
  P window = p;
  window.tail = make_paged_kv_view(pool.k.data(), nullptr, KvDtype::bf16, 1, OneSequencePool::kBlockSize, heads, dim);
  window.batch.fp8_lens = fp8_lens.as<int32_t>();
  window.batch.tail_slots = ring.as<int32_t>();
  window.batch.tail_ring_blocks = 1;
  check_refused(window, [](P& q) { q.tail.num_blocks = 0; }, run, "bad tail view");
  check_refused(window, [](P& q) { q.cache.dtype = KvDtype::bf16; }, run, "the window needs an FP8 pool");
  check_refused(window, [](P& q) { q.batch.tail_slots = nullptr; }, run, "tail_slots / tail_ring_blocks set");
}

TEST_CASE("kv_spill on CUDA refuses what it cannot spill and reports a block outside the pool", "[gpu][kv_spill]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  // One sequence of 20 tokens, positions [0, 16) leaving a window of 2 ring blocks of 16.
  const OneSequencePool pool(*gpu, 3, 20);
  const int32_t bs = OneSequencePool::kBlockSize, heads = OneSequencePool::kHeads, dim = OneSequencePool::kDim;
  DeviceBuffer tail = to_device(*gpu, std::vector<std::uint16_t>(std::size_t{2} * bs * heads * dim, bf16_encode(0.5f)));
  DeviceBuffer table = to_device(*gpu, std::vector<int32_t>{2, 0});
  DeviceBuffer spill_starts = to_device(*gpu, std::vector<int32_t>{0}), fp8_lens = to_device(*gpu, std::vector<int32_t>{16});
  DeviceBuffer ring = to_device(*gpu, std::vector<int32_t>{0});
  KvSpillParams p;
  p.cache = pool.cache;
  p.tail = make_paged_kv_view(tail.data(), nullptr, KvDtype::bf16, 2, bs, heads, dim);  // K-only window
  p.batch = pool.batch;
  p.batch.block_tables = table.as<int32_t>();
  p.batch.max_blocks_per_seq = 2;
  p.batch.fp8_lens = fp8_lens.as<int32_t>();
  p.batch.tail_slots = ring.as<int32_t>();
  p.batch.tail_ring_blocks = 2;
  p.spill_starts = spill_starts.as<int32_t>();
  p.max_spill_tokens = 16;
  gpu->kv_spill(p, Stream{});
  const std::vector<std::uint8_t> spilled = to_host<std::uint8_t>(*gpu, pool.k, pool.pool_bytes);
  const std::size_t block2 = std::size_t{2} * bs * heads * dim;  // positions 0-15 live in block 2
  CHECK(std::all_of(spilled.begin() + static_cast<std::ptrdiff_t>(block2), spilled.end(),
                    [](std::uint8_t b) { return b == fp8_e4m3_encode(0.5f); }));
  CHECK(std::all_of(spilled.begin(), spilled.begin() + static_cast<std::ptrdiff_t>(block2),
                    [](std::uint8_t b) { return b == 0; }));

  using P = KvSpillParams;
  const auto run = [&](const P& bad) { gpu->kv_spill(bad, Stream{}); };
  check_refused(p, [](P& q) { q.max_spill_tokens = -1; }, run, "negative max_spill_tokens");
  check_refused(p, [](P& q) { q.spill_starts = nullptr; }, run,
                "needs the window's fields, spill_starts, block tables and scales");
  check_refused(p, [](P& q) { q.tail.head_dim = 32; }, run, "needs an FP8 pool and a bf16 tail of the same geometry");

  // Block 7 of a 3-block pool: nothing is written, the error is raised at synchronize.
  const DeviceBuffer outside = to_device(*gpu, std::vector<int32_t>{7, 0});
  KvSpillParams wild = p;
  wild.batch.block_tables = outside.as<int32_t>();
  gpu->kv_spill(wild, Stream{});
  CHECK_THROWS_AS(gpu->synchronize(Stream{}), std::out_of_range);
  CHECK(to_host<std::uint8_t>(*gpu, pool.k, pool.pool_bytes) == spilled);
}

TEST_CASE("rms_norm and rope on CUDA refuse shapes they cannot run", "[gpu][norm][rope]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  DeviceBuffer x = to_device(*gpu, random_bf16(64, 5)), w = to_device(*gpu, random_bf16(64, 6));
  RmsNormParams n;
  n.x = x.data();
  n.out = x.data();
  n.weight = w.as<std::uint16_t>();
  n.num_tokens = 1;
  n.dim = 64;
  CHECK_NOTHROW(gpu->rms_norm(n, Stream{}));
  using N = RmsNormParams;
  const auto run = [&](const N& bad) { gpu->rms_norm(bad, Stream{}); };
  check_refused(n, [](N& q) { q.eps = -1.0f; }, run, "bad shape or eps");
  check_refused(n, [](N& q) { q.dim = int64_t{1} << 24; }, run, "rows longer than");  // far past the kernel's limit

  gpu->set_rope_table(std::vector<float>(16, 1.0f), 8);  // a 32-wide rotary dim
  const DeviceBuffer pos = to_device(*gpu, std::vector<int32_t>{0});
  RopeParams r;
  r.q = x.data();
  r.positions = pos.as<int32_t>();
  r.num_tokens = 1;
  r.num_q_heads = 4;
  r.head_dim = 16;  // narrower than the rotary dim
  check_refused([&] { gpu->rope(r, Stream{}); }, "rotary dim larger than head_dim");
  r.num_q_heads = 2;
  r.head_dim = 32;
  CHECK_NOTHROW(gpu->rope(r, Stream{}));
  gpu->synchronize(Stream{});
}

TEST_CASE("add_bias_f32 on CUDA adds a bf16 bias to strided fp32 rows", "[gpu][linear]") {
  if (cuda::device_count() == 0) return;
  // cuBLASLt's epilogue takes no bias for fp32 output (the LM head's logits): this kernel does.
  const int64_t rows = 3, cols = 40, stride = 48;
  std::vector<float> y(static_cast<std::size_t>(rows * stride));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(i % 7);
  const std::vector<std::uint16_t> bias = narrow(std::vector<float>(cols, -2.5f));
  cuda::DeviceBuffer d_y(y.size() * sizeof(float)), d_bias(bias.size() * sizeof(std::uint16_t));
  d_y.copy_from_host(y.data(), y.size() * sizeof(float));
  d_bias.copy_from_host(bias.data(), bias.size() * sizeof(std::uint16_t));
  auto* y_dev = static_cast<float*>(d_y.data());
  const auto* bias_dev = static_cast<const std::uint16_t*>(d_bias.data());
  cuda::add_bias_f32_cuda(y_dev, stride, bias_dev, rows, cols, nullptr);
  cuda::add_bias_f32_cuda(y_dev, stride, bias_dev, 0, cols, nullptr);  // nothing to do
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(y.size());
  d_y.copy_to_host(got.data(), got.size() * sizeof(float));
  for (std::size_t i = 0; i < y.size(); ++i) {
    const bool biased = static_cast<int64_t>(i) % stride < cols;
    REQUIRE(got[i] == y[i] + (biased ? -2.5f : 0.0f));  // row padding untouched
  }
  check_refused([&] { cuda::add_bias_f32_cuda(y_dev, stride, bias_dev, 65536, cols, nullptr); },
                "more than 65,535 rows");
}

TEST_CASE("gather_rows on CUDA copies rows 16-byte vectors cannot read element by element", "[gpu][elementwise]") {
  auto gpu = cuda_backend_or_skip();
  if (!gpu) return;
  const int64_t dim = 13, num_x_rows = 5;
  const std::vector<std::uint16_t> x = random_bf16(static_cast<std::size_t>(num_x_rows * dim), 12);
  const std::vector<int32_t> rows{4, 0, 4, 2};
  DeviceBuffer d_x = to_device(*gpu, x), d_rows = to_device(*gpu, rows);
  DeviceBuffer d_out(*gpu, rows.size() * dim * sizeof(std::uint16_t));
  GatherRowsParams g;
  g.x = d_x.data();
  g.rows = d_rows.as<int32_t>();
  g.out = d_out.data();
  g.num_x_rows = num_x_rows;
  g.num_rows = static_cast<int64_t>(rows.size());
  g.dim = dim;
  gpu->gather_rows(g, Stream{});
  std::vector<std::uint16_t> expected;
  for (int32_t r : rows) expected.insert(expected.end(), x.begin() + r * dim, x.begin() + (r + 1) * dim);
  CHECK(count_mismatches(to_host<std::uint16_t>(*gpu, d_out, expected.size()), expected) == 0);
}
