// Decode attention on the CPU, FP8 pool vs bf16 pool, next to the memory bandwidth measured in
// the same run with the same threads (the limit decode attention chases: it reads every K and
// V byte of the context once per step).
//
// Layer shape: Llama-3-8B (32 query heads, 8 KV heads, head_dim 128), block 16, blocks of each
// sequence scattered over the pool as in a long-running server. Contexts 512..16384, batch
// 1..32. Usage: bench_attention [--threads N] [--max-gib G] [--context C --batch B (one cell)]
// [--isa best|avx512bf16|avx512|avx2|scalar] [--warm 1 (every call re-reads the same blocks: with
// a small cell, the kernels' compute alone)] [--window W (instead: FP8 decode without and with a
// bf16 recent window of W tokens, K+V and K only, at 512, 4096 and 16384 tokens)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/kv_window.hpp"
#include "machine_limits.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/host_memory.hpp"
#include "kernels/cpu/paged_attention_cpu.hpp"

using namespace fp8serve;
using Clock = std::chrono::steady_clock;


// The pool lives in the same kind of memory the engine gives it (2 MiB pages where possible).
using PoolBytes = std::vector<uint8_t, fp8serve::cpu::HostMemoryAllocator<uint8_t>>;
namespace {

constexpr int32_t kNumHeads = 32, kNumKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void fill_random(PoolBytes& bytes, uint64_t seed, bool fp8) {
  uint64_t x = seed | 1;
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t w = x;
    if (fp8) w &= 0x3f3f3f3f3f3f3f3full;  // small magnitudes, no NaN codes
    else w &= 0xbfffbfffbfffbfffull;       // bf16 with exponent < 128: finite, modest values
    std::memcpy(bytes.data() + i, &w, std::min<std::size_t>(8, bytes.size() - i));
  }
}


struct Setup {
  PoolBytes k8, v8, k16, v16;  // the FP8 and the bf16 pool
  const uint8_t* k(KvDtype dtype) const { return dtype == KvDtype::fp8_e4m3 ? k8.data() : k16.data(); }
  const uint8_t* v(KvDtype dtype) const { return dtype == KvDtype::fp8_e4m3 ? v8.data() : v16.data(); }
  std::vector<int32_t> query_start_loc, context_lens;
  std::vector<float> q, out, k_scales, v_scales;
  // The bf16 window's tail pool (--window): ring s for sequence s, random bf16.
  PoolBytes tail_k, tail_v;
  std::vector<int32_t> fp8_lens, rings;
  KvWindow window;
  int32_t num_blocks = 0;
  std::vector<int32_t> ids;  // every block id, shuffled: blocks sit anywhere, as in a long-running server

  bool warm = false;  // --warm: every call uses the first set (below)
  // Every timed call reads its K and V cold, as one layer's attention does in a decode step (the
  // other layers' KV and the weights pass through the caches in between): call i of a cell
  // uses the i-th of up to 64 disjoint sets of n blocks (block tables [batch, n / batch]).
  const int32_t* tables(int64_t call, int64_t n) const {
    const int64_t sets = warm ? 1 : std::max<int64_t>(1, std::min<int64_t>(num_blocks / n, 64));
    return ids.data() + (call % sets) * n;
  }
};

using Step = std::function<void(int64_t call)>;

// The median seconds of each step, run side by side: round r calls every step once, in turn
// (step i of n with call n * r + i, so no two calls in a row read the same blocks, see
// Setup::tables), for at least 3 rounds and up to 1.5 s or 50 rounds, after one warm-up round.
// This VM's memory speed drifts by tens of percent over seconds; interleaving puts FP8, bf16
// and their pure reads in the same conditions, so their ratios hold even when the absolute
// times move.
std::vector<double> median_seconds(const std::vector<Step>& steps) {
  const auto n = static_cast<int64_t>(steps.size());
  for (int64_t i = 0; i < n; ++i) steps[static_cast<std::size_t>(i)](i);
  std::vector<std::vector<double>> times(steps.size());
  const Clock::time_point start = Clock::now();
  for (int64_t round = 1; round <= 3 || (seconds_since(start) < 1.5 && round <= 50); ++round) {
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const Clock::time_point t0 = Clock::now();
      steps[i](n * round + static_cast<int64_t>(i));
      times[i].push_back(seconds_since(t0));
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

// One decode step of `batch` sequences of `context` tokens; `tail`: FP8 with s.window's bf16
// window, K+V (values) or K only, its newest tokens in the tail (what the engine reads; PRECOND:
// s.fp8_lens holds the batch's FP8 lengths).
Step decode_step(cpu::ThreadPool& pool, cpu::AttentionWorkspace& workspace, cpu::CpuIsa isa, Setup& s,
                 KvDtype dtype, int32_t batch, int32_t context, bool tail = false, bool values = true) {
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  s.query_start_loc.resize(static_cast<std::size_t>(batch) + 1);
  std::iota(s.query_start_loc.begin(), s.query_start_loc.end(), 0);
  s.context_lens.assign(static_cast<std::size_t>(batch), context);
  PagedAttentionParams p;
  p.q = s.q.data();
  p.out = s.out.data();
  p.q_token_stride = p.out_token_stride = kNumHeads * kHeadDim;
  p.num_heads = kNumHeads;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.cache = make_paged_kv_view(const_cast<uint8_t*>(s.k(dtype)), const_cast<uint8_t*>(s.v(dtype)), dtype, s.num_blocks,
                               kBlockSize, kNumKvHeads, kHeadDim);
  p.batch.num_seqs = batch;
  p.batch.num_tokens = batch;
  p.batch.query_start_loc = s.query_start_loc.data();
  p.batch.context_lens = s.context_lens.data();
  p.batch.max_blocks_per_seq = blocks_per_seq;
  p.batch.k_scales = s.k_scales.data();
  p.batch.v_scales = s.v_scales.data();
  if (tail) {
    p.tail = make_paged_kv_view(s.tail_k.data(), values ? s.tail_v.data() : nullptr, KvDtype::bf16,
                                static_cast<int32_t>(s.rings.size()) * s.window.ring_blocks(), kBlockSize, kNumKvHeads,
                                kHeadDim);
    p.batch.fp8_lens = s.fp8_lens.data();
    p.batch.tail_slots = s.rings.data();
    p.batch.tail_ring_blocks = s.window.ring_blocks();
  }
  return [&pool, &workspace, &s, isa, p, n = int64_t{blocks_per_seq} * batch](int64_t call) mutable {
    p.batch.block_tables = s.tables(call, n);
    cpu::paged_attention_cpu(p, pool, workspace, isa);
  };
}

// The ceiling of this access pattern: the very bytes a decode step reads, in the kernel's
// order and on its threads, with nothing else to do. One 8-byte load per 64-byte line of each
// block's K and V rows of one KV head, one (sequence, KV head) per work item, the next block
// prefetched into L2 as the kernel does. (Without that prefetch the short runs cost FP8 the
// most: its 2 KiB per block and head read at ~17 GB/s where bf16's 4 KiB read at ~25; with it
// both read at ~25-28 GB/s on this VM.)
Step gather_read_step(cpu::ThreadPool& pool, const Setup& s, KvDtype dtype, int32_t batch, int32_t context) {
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t elem = dtype == KvDtype::fp8_e4m3 ? 1 : 2;
  const PagedKvView view = make_paged_kv_view(nullptr, nullptr, dtype, s.num_blocks, kBlockSize, kNumKvHeads, kHeadDim);
  const int64_t row_bytes = kHeadDim * elem, token_stride = view.v_token_stride * elem;
  const int64_t head_stride = view.head_stride * elem, block_stride = view.block_stride * elem;
  const uint8_t* k = s.k(dtype);
  const uint8_t* v = s.v(dtype);
  auto sinks = std::make_shared<std::vector<uint64_t>>(static_cast<std::size_t>(batch) * kNumKvHeads);
  return [=, &pool, &s](int64_t call) {
    const int32_t* tables = s.tables(call, int64_t{blocks_per_seq} * batch);
    pool.parallel_for(static_cast<int64_t>(sinks->size()), [&](int64_t item) {
      const int32_t seq = static_cast<int32_t>(item / kNumKvHeads), head = static_cast<int32_t>(item % kNumKvHeads);
      const int32_t* table = tables + static_cast<std::ptrdiff_t>(seq) * blocks_per_seq;
      uint64_t acc = 0;
      for (int32_t b = 0; b < blocks_per_seq; ++b) {
        const int64_t base = table[b] * block_stride + head * head_stride;
        if (b + 1 < blocks_per_seq) {  // the next block, into L2, as the kernel asks for it
          const int64_t next = table[b + 1] * block_stride + head * head_stride;
          for (int64_t x = 0; x < kBlockSize * row_bytes; x += 64) {
            __builtin_prefetch(k + next + x, 0, 2);
            __builtin_prefetch(v + next + x, 0, 2);
          }
        }
        for (int32_t t = 0; t < kBlockSize; ++t)
          for (int64_t x = 0; x < row_bytes; x += 64) {
            uint64_t a, c;
            std::memcpy(&a, k + base + t * token_stride + x, 8);
            std::memcpy(&c, v + base + t * token_stride + x, 8);
            acc ^= a + c;
          }
      }
      (*sinks)[static_cast<std::size_t>(item)] = acc;
    });
  };
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double max_gib = 2.0;  // largest bf16 pool to allocate
  int32_t only_context = 0, only_batch = 0;  // one cell of the table, for experiments
  cpu::CpuIsa isa = cpu::CpuIsa::best;
  bool warm = false;
  int32_t window = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--max-gib") max_gib = std::atof(argv[i + 1]);
    else if (flag == "--context") only_context = std::atoi(argv[i + 1]);
    else if (flag == "--batch") only_batch = std::atoi(argv[i + 1]);
    else if (flag == "--isa") isa = cpu::parse_cpu_isa(argv[i + 1]);
    else if (flag == "--warm") warm = std::atoi(argv[i + 1]) != 0;
    else if (flag == "--window") window = std::atoi(argv[i + 1]);
  }
  cpu::ThreadPool pool(threads);
  cpu::AttentionWorkspace workspace;
  std::printf("bench_attention: %d threads, cpu: %s, kernel isa: %s\n", threads,
              cpu::describe(cpu::cpu_features()).c_str(),
              cpu::cpu_isa_name(cpu::resolve_cpu_isa(isa, kHeadDim)));
  const double bandwidth = bench::read_bandwidth(pool, std::size_t{1} << 30);
  std::printf("measured read bandwidth (1 GiB stream, %d threads): %.1f GB/s\n", threads, bandwidth / 1e9);
  std::printf("layer: %d heads, %d kv heads, head_dim %d, block %d; KV bytes/token/layer: fp8 %d, bf16 %d\n\n",
              kNumHeads, kNumKvHeads, kHeadDim, kBlockSize, 2 * kNumKvHeads * kHeadDim, 4 * kNumKvHeads * kHeadDim);

  const int32_t contexts[] = {512, 1024, 2048, 4096, 8192, 16384};
  const int32_t batches[] = {1, 4, 8, 16, 32};
  const int64_t bytes_per_token_fp8 = 2LL * kNumKvHeads * kHeadDim;
  const int64_t max_tokens = static_cast<int64_t>(max_gib * (1ull << 30)) / (2 * bytes_per_token_fp8);
  Setup s;
  s.warm = warm;
  if (warm) std::printf("warm: every call re-reads the same blocks (the figures are not memory bandwidth)\n\n");
  s.num_blocks = static_cast<int32_t>(std::min<int64_t>(max_tokens, 32LL * 16384) / kBlockSize);
  const std::size_t pool_elems = static_cast<std::size_t>(s.num_blocks) * kBlockSize * kNumKvHeads * kHeadDim;
  s.k8.resize(pool_elems), s.v8.resize(pool_elems), s.k16.resize(2 * pool_elems), s.v16.resize(2 * pool_elems);
  fill_random(s.k8, 1, true);
  fill_random(s.v8, 2, true);
  fill_random(s.k16, 3, false);
  fill_random(s.v16, 4, false);
  std::mt19937 rng(7);
  s.ids.resize(static_cast<std::size_t>(s.num_blocks));
  std::iota(s.ids.begin(), s.ids.end(), 0);
  std::shuffle(s.ids.begin(), s.ids.end(), rng);
  std::normal_distribution<float> normal;
  s.q.resize(32 * kNumHeads * kHeadDim);
  for (float& x : s.q) x = normal(rng);
  s.out.resize(s.q.size());
  s.k_scales.assign(32, 0.01f);
  s.v_scales.assign(32, 0.01f);

  if (window > 0) {
    // FP8 decode without and with the window, timed in turn (median_seconds): what the
    // two-segment read costs. The tail's bytes are the same in every call (they are few).
    s.window = KvWindow{window, true, kBlockSize};
    s.rings.resize(32);
    std::iota(s.rings.begin(), s.rings.end(), 0);
    const std::size_t tail_elems = s.rings.size() * s.window.ring_blocks() * kBlockSize * kNumKvHeads * kHeadDim;
    s.tail_k.resize(2 * tail_elems), s.tail_v.resize(2 * tail_elems);
    fill_random(s.tail_k, 5, false);
    fill_random(s.tail_v, 6, false);
    std::printf("bf16 window %d tokens (rings of %d blocks): FP8 decode without it, with it (K+V), with it (K only)\n\n",
                window, s.window.ring_blocks());
    std::printf("%7s %5s | %8s | %8s %7s | %8s %7s\n", "context", "batch", "fp8 ms", "+w kv ms", "ratio", "+w k ms", "ratio");
    for (int32_t context : {512, 4096, 16384}) {
      for (int32_t batch : {1, 8}) {
        if ((only_context != 0 && context != only_context) || (only_batch != 0 && batch != only_batch)) continue;
        if (int64_t{(context + kBlockSize - 1) / kBlockSize} * batch > s.num_blocks) continue;
        s.fp8_lens.assign(static_cast<std::size_t>(batch), s.window.fp8_len(context));
        const std::vector<double> t = median_seconds(
            {decode_step(pool, workspace, isa, s, KvDtype::fp8_e4m3, batch, context),
             decode_step(pool, workspace, isa, s, KvDtype::fp8_e4m3, batch, context, true, true),
             decode_step(pool, workspace, isa, s, KvDtype::fp8_e4m3, batch, context, true, false)});
        std::printf("%7d %5d | %8.3f | %8.3f %6.3fx | %8.3f %6.3fx\n", context, batch, t[0] * 1e3, t[1] * 1e3,
                    t[1] / t[0], t[2] * 1e3, t[2] / t[0]);
        std::fflush(stdout);
      }
    }
    std::printf("\ntarget: the window within 3%% of pure FP8 at long contexts (ratio <= 1.03)\n");
    return 0;
  }

  // %strm: of the stream read above; %gath: of a pure read of the same bytes in the same order
  // (time_gather_read: the ceiling of this access pattern, measured next to each cell).
  std::printf("%7s %5s | %8s %6s %5s %5s | %8s %6s %5s %5s | %8s\n", "context", "batch", "fp8 ms", "GB/s",
              "%strm", "%gath", "bf16 ms", "GB/s", "%strm", "%gath", "bf16/fp8");
  for (int32_t context : contexts) {
    for (int32_t batch : batches) {
      if ((only_context != 0 && context != only_context) || (only_batch != 0 && batch != only_batch)) continue;
      const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
      if (static_cast<int64_t>(blocks_per_seq) * batch > s.num_blocks) continue;
      const double kv_bytes = static_cast<double>(bytes_per_token_fp8) * context * batch;
      const std::vector<double> t = median_seconds(
          {decode_step(pool, workspace, isa, s, KvDtype::fp8_e4m3, batch, context),
           decode_step(pool, workspace, isa, s, KvDtype::bf16, batch, context),
           gather_read_step(pool, s, KvDtype::fp8_e4m3, batch, context),
           gather_read_step(pool, s, KvDtype::bf16, batch, context)});
      const double t8 = t[0], t16 = t[1], g8 = t[2], g16 = t[3];
      std::printf("%7d %5d | %8.3f %6.1f %5.0f %5.0f | %8.3f %6.1f %5.0f %5.0f | %7.2fx\n", context, batch,
                  t8 * 1e3, kv_bytes / t8 / 1e9, 100.0 * kv_bytes / t8 / bandwidth, 100.0 * g8 / t8, t16 * 1e3,
                  2 * kv_bytes / t16 / 1e9, 100.0 * 2 * kv_bytes / t16 / bandwidth, 100.0 * g16 / t16, t16 / t8);
      std::fflush(stdout);
    }
  }
  std::printf("\ntargets: bf16/fp8 >= 1.5x at context >= 4096, >= 1.0x at 512; fp8 >= 60%% of bandwidth at 16384 x 8\n");
  return 0;
}
