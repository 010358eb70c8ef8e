// CUDA paged attention on the GPU: decode against the measured device-to-device copy bandwidth,
// FP8 pool vs bf16 pool vs FP8 with the bf16 recent window, and prefill tokens/s.
//
// Layer shape: Llama-3-8B (32 query heads, 8 KV heads, head_dim 128), block 16, each sequence's
// blocks scattered over the pool. Decode: contexts 1k-32k, batch 1-64; every timed call reads
// its KV cold (calls rotate over disjoint block sets covering more than the L2). Bytes counted
// are those attention must read: K and V of every context token (the tail's tokens in bf16).
// Prefill: one prompt of 1k or 8k tokens (one chunk), and 8k as four 2k chunks.
// Decode by GQA group: 8 KV heads with 1, 2, 4 or 8 query heads each, batch 4, contexts 4k-32k,
// FP8 and bf16, on each decode kernel (CUDA cores and tensor cores, PagedAttentionCudaOptions::
// decode_math), against the same copy bandwidth (issue 21's goal: FP8 >= 85% of it).
// Usage: bench_attention_cuda [--quick] (small sweep) [--context C --batch B (one decode cell)]
// Prints a table, then one line "json: {...}" with every figure for tests/gpu/run.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"

using namespace fp8serve;

namespace {

constexpr int32_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr int32_t kWindow = 64;  // bf16 window of the "fp8+tail" runs (tokens)
constexpr int64_t kColdBytes = int64_t{512} << 20;  // > the H100/H200 L2 (50 MB) many times over

struct DeviceArray {
  void* ptr = nullptr;
  explicit DeviceArray(std::size_t bytes) { CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 16))); }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

template <class T>
void upload(DeviceArray& dst, const std::vector<T>& src) {
  CUDA_CHECK(cudaMemcpy(dst.ptr, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer.
double copy_bandwidth() {
  const std::size_t bytes = std::size_t{1} << 30;
  DeviceArray a(bytes), b(bytes);
  CUDA_CHECK(cudaMemset(a.ptr, 1, bytes));
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    CUDA_CHECK(cudaEventRecord(t0));
    CUDA_CHECK(cudaMemcpyAsync(b.ptr, a.ptr, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep > 0) best = std::min(best, ms);
  }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return 2.0 * static_cast<double>(bytes) / (best * 1e-3);
}

// One layer's pools: FP8 and bf16, each holding `blocks` blocks, plus a bf16 tail pool.
struct Pools {
  int32_t blocks;
  DeviceArray k8, v8, k16, v16, tail_k, tail_v;
  Pools(int32_t num_blocks, int32_t tail_blocks)
      : blocks(num_blocks),
        k8(bytes(num_blocks, 1)), v8(bytes(num_blocks, 1)), k16(bytes(num_blocks, 2)), v16(bytes(num_blocks, 2)),
        tail_k(bytes(tail_blocks, 2)), tail_v(bytes(tail_blocks, 2)) {
    // Finite values: E4M3 0x3c = 1.5, bf16 0x3c3c ~ 0.0115 (the kernels' time does not depend on them).
    for (DeviceArray* a : {&k8, &v8}) CUDA_CHECK(cudaMemset(a->ptr, 0x3c, bytes(num_blocks, 1)));
    for (DeviceArray* a : {&k16, &v16}) CUDA_CHECK(cudaMemset(a->ptr, 0x3c, bytes(num_blocks, 2)));
    for (DeviceArray* a : {&tail_k, &tail_v}) CUDA_CHECK(cudaMemset(a->ptr, 0x3c, bytes(tail_blocks, 2)));
  }
  static std::size_t bytes(int64_t num_blocks, int64_t elem) {
    return static_cast<std::size_t>(num_blocks * kKvHeads * kBlock * kHeadDim * elem);
  }
};

enum class Kind { fp8, fp8_tail, bf16 };
const char* kind_name(Kind k) { return k == Kind::fp8 ? "fp8" : k == Kind::fp8_tail ? "fp8+tail" : "bf16"; }

// A batch over the pool: `sets` disjoint block sets (calls rotate over them), each giving every
// sequence its blocks at random places.
struct Batch {
  int32_t num_seqs, num_tokens, max_blocks, sets, heads;
  DeviceArray starts, lens, scales, fp8_lens, tail_slots, q, out;
  std::vector<std::unique_ptr<DeviceArray>> tables;

  Batch(const std::vector<int32_t>& contexts, const std::vector<int32_t>& new_tokens, int32_t pool_blocks,
        int64_t bytes_per_call, std::mt19937& rng, int32_t query_heads = kHeads)
      : num_seqs(static_cast<int32_t>(contexts.size())),
        num_tokens(std::accumulate(new_tokens.begin(), new_tokens.end(), 0)),
        max_blocks(0),
        sets(0),
        heads(query_heads),
        starts((contexts.size() + 1) * 4),
        lens(contexts.size() * 4),
        scales(contexts.size() * 4),
        fp8_lens(contexts.size() * 4),
        tail_slots(contexts.size() * 4),
        q(static_cast<std::size_t>(num_tokens) * query_heads * kHeadDim * 2),
        out(static_cast<std::size_t>(num_tokens) * query_heads * kHeadDim * 2) {
    std::vector<int32_t> start{0}, fp8(contexts.size()), slots(contexts.size());
    int64_t blocks_needed = 0;
    for (std::size_t s = 0; s < contexts.size(); ++s) {
      start.push_back(start.back() + new_tokens[s]);
      const int32_t n = (contexts[s] + kBlock - 1) / kBlock;
      blocks_needed += n;
      max_blocks = std::max(max_blocks, n);
      fp8[s] = std::max(0, (contexts[s] - kWindow) / kBlock * kBlock);
      slots[s] = static_cast<int32_t>(s);
    }
    upload(starts, start);
    upload(lens, contexts);
    upload(scales, std::vector<float>(contexts.size(), 0.01f));
    upload(fp8_lens, fp8);
    upload(tail_slots, slots);
    CUDA_CHECK(cudaMemset(q.ptr, 0x3c, static_cast<std::size_t>(num_tokens) * heads * kHeadDim * 2));
    sets = static_cast<int32_t>(std::clamp<int64_t>((kColdBytes + bytes_per_call - 1) / bytes_per_call, 1,
                                                    pool_blocks / std::max<int64_t>(blocks_needed, 1)));
    std::vector<int32_t> ids(static_cast<std::size_t>(pool_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::size_t next = 0;
    for (int32_t set = 0; set < sets; ++set) {
      std::vector<int32_t> table(contexts.size() * static_cast<std::size_t>(max_blocks), 0);
      for (std::size_t s = 0; s < contexts.size(); ++s) {
        const int32_t n = (contexts[s] + kBlock - 1) / kBlock;
        for (int32_t b = 0; b < n; ++b) table[s * static_cast<std::size_t>(max_blocks) + b] = ids[next++];
      }
      tables.push_back(std::make_unique<DeviceArray>(table.size() * 4));
      upload(*tables.back(), table);
    }
  }

  PagedAttentionParams params(const Pools& pools, Kind kind, int32_t set) const {
    PagedAttentionParams p;
    p.q = q.ptr;
    p.out = out.ptr;
    p.num_heads = heads;
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    const bool fp8 = kind != Kind::bf16;
    p.cache = make_paged_kv_view(fp8 ? pools.k8.ptr : pools.k16.ptr, fp8 ? pools.v8.ptr : pools.v16.ptr,
                                 fp8 ? KvDtype::fp8_e4m3 : KvDtype::bf16, pools.blocks, kBlock, kKvHeads, kHeadDim);
    const int32_t ring = kWindow / kBlock + 1;
    p.tail = make_paged_kv_view(pools.tail_k.ptr, pools.tail_v.ptr, KvDtype::bf16, num_seqs * ring, kBlock,
                                kKvHeads, kHeadDim);
    p.batch.num_seqs = num_seqs;
    p.batch.num_tokens = num_tokens;
    p.batch.query_start_loc = starts.as<int32_t>();
    p.batch.context_lens = lens.as<int32_t>();
    p.batch.block_tables = tables[static_cast<std::size_t>(set)]->as<int32_t>();
    p.batch.max_blocks_per_seq = max_blocks;
    p.batch.k_scales = scales.as<float>();
    p.batch.v_scales = scales.as<float>();
    if (kind == Kind::fp8_tail) {
      p.batch.fp8_lens = fp8_lens.as<int32_t>();
      p.batch.tail_slots = tail_slots.as<int32_t>();
      p.batch.tail_ring_blocks = ring;
    }
    return p;
  }
};

// Bytes decode attention reads for these contexts: K and V of every token, FP8 (1 byte) or bf16.
int64_t kv_bytes(const std::vector<int32_t>& contexts, Kind kind) {
  int64_t total = 0;
  for (int32_t len : contexts) {
    const int64_t fp8_len = kind == Kind::fp8_tail ? std::max(0, (len - kWindow) / kBlock * kBlock) : len;
    const int64_t per_token = 2 * int64_t{kKvHeads} * kHeadDim;
    total += kind == Kind::bf16 ? len * per_token * 2 : fp8_len * per_token + (len - fp8_len) * per_token * 2;
  }
  return total;
}

// Milliseconds per call: calls rotate over the batch's block sets; median of 5 timed rounds.
double time_calls(const Batch& batch, const Pools& pools, Kind kind, void* workspace, std::size_t workspace_bytes,
                  const cuda::PagedAttentionCudaOptions& options, int calls) {
  cudaEvent_t t0, t1;
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  int set = 0;
  auto call = [&] {
    cuda::paged_attention_cuda(batch.params(pools, kind, set), workspace, workspace_bytes, nullptr, options);
    set = (set + 1) % batch.sets;
  };
  for (int i = 0; i < 3; ++i) call();
  std::vector<float> rounds;
  for (int round = 0; round < 5; ++round) {
    CUDA_CHECK(cudaEventRecord(t0));
    for (int i = 0; i < calls; ++i) call();
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    rounds.push_back(ms / static_cast<float>(calls));
  }
  CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  std::sort(rounds.begin(), rounds.end());
  return rounds[2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int32_t one_context = 0, one_batch = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--context" && i + 1 < argc) {
      one_context = std::atoi(argv[++i]);
    } else if (a == "--batch" && i + 1 < argc) {
      one_batch = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_attention_cuda [--quick] [--context C --batch B]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "bench_attention_cuda: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<int32_t> contexts{1024, 2048, 4096, 8192, 16384, 32768}, batches{1, 4, 16, 64};
  if (quick) contexts = {1024, 8192}, batches = {1, 16};
  if (one_context > 0) contexts = {one_context};
  if (one_batch > 0) batches = {one_batch};
  const int32_t max_context = *std::max_element(contexts.begin(), contexts.end());
  const int32_t max_batch = *std::max_element(batches.begin(), batches.end());

  const double copy = copy_bandwidth();
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::printf("bandwidth: %.0f GB/s (device-to-device copy, bytes read + written)\n", copy / 1e9);
  std::ostringstream json;
  json << "{\"device\": \"" << prop.name << "\", \"copy_gb_s\": " << copy / 1e9 << ", \"decode\": [";

  // Enough blocks for the largest cell twice over (so small cells rotate over cold sets).
  const int64_t cell_blocks = int64_t{max_batch} * ((max_context + kBlock - 1) / kBlock);
  const int32_t pool_blocks = static_cast<int32_t>(std::max<int64_t>(2 * cell_blocks, (kColdBytes * 2) / (int64_t{kKvHeads} * kBlock * kHeadDim * 2)));
  Pools pools(pool_blocks, max_batch * (kWindow / kBlock + 1));
  cuda::PagedAttentionCudaLimits limits{std::max(max_batch, 1), kHeads, kKvHeads, kHeadDim};
  const std::size_t workspace_bytes = cuda::paged_attention_cuda_workspace_bytes(limits);
  DeviceArray workspace(workspace_bytes);
  std::mt19937 rng(1);

  std::printf("\n%-9s %6s %6s %10s %9s %7s %10s\n", "kv", "batch", "context", "us/call", "GB/s", "%copy",
              "vs bf16");
  bool first_row = true;
  for (int32_t batch_size : batches) {
    for (int32_t context : contexts) {
      const std::vector<int32_t> lens(static_cast<std::size_t>(batch_size), context);
      const std::vector<int32_t> ones(static_cast<std::size_t>(batch_size), 1);
      const Batch batch(lens, ones, pool_blocks, kv_bytes(lens, Kind::fp8), rng);
      double bf16_us = 0;
      for (Kind kind : {Kind::bf16, Kind::fp8, Kind::fp8_tail}) {
        const int64_t bytes = kv_bytes(lens, kind);
        const int calls = static_cast<int>(std::clamp<int64_t>((int64_t{2} << 30) / bytes, 8, 200));
        const double ms = time_calls(batch, pools, kind, workspace.ptr, workspace_bytes, {}, calls);
        const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
        if (kind == Kind::bf16) bf16_us = ms * 1e3;
        std::printf("%-9s %6d %6d %10.1f %9.0f %6.1f%% %9.2fx\n", kind_name(kind), batch_size, context, ms * 1e3,
                    gbs, 100.0 * gbs * 1e9 / copy, bf16_us / (ms * 1e3));
        json << (first_row ? "" : ", ") << "{\"kv\": \"" << kind_name(kind) << "\", \"batch\": " << batch_size
             << ", \"context\": " << context << ", \"us\": " << ms * 1e3 << ", \"gb_s\": " << gbs
             << ", \"percent_of_copy\": " << 100.0 * gbs * 1e9 / copy << "}";
        first_row = false;
      }
    }
  }
  json << "], \"prefill\": [";

  // Prefill: causal attention FLOPs = 2 (QK, PV) x 2 x heads x head_dim x n_new x (keys seen).
  std::printf("\n%-9s %6s %6s %6s %10s %12s %8s\n", "kv", "prompt", "chunk", "cached", "ms", "tokens/s", "TFLOP/s");
  first_row = true;
  struct PrefillCell {
    int32_t prompt, chunk;
  };
  std::vector<PrefillCell> cells{{1024, 1024}, {8192, 8192}, {8192, 2048}};
  if (quick) cells = {{1024, 1024}, {8192, 2048}};
  for (const PrefillCell& cell : cells) {
    for (Kind kind : {Kind::bf16, Kind::fp8}) {
      double total_ms = 0, flops = 0;
      for (int32_t done = 0; done < cell.prompt; done += cell.chunk) {
        const int32_t n = std::min(cell.chunk, cell.prompt - done);
        const Batch batch({done + n}, {n}, pool_blocks, kv_bytes({done + n}, kind), rng);
        total_ms += time_calls(batch, pools, kind, workspace.ptr, workspace_bytes, {}, 3);
        flops += 4.0 * kHeads * kHeadDim * n * (done + (n + 1) / 2.0);
      }
      const double tokens_s = cell.prompt / (total_ms * 1e-3);
      std::printf("%-9s %6d %6d %6s %10.2f %12.0f %8.1f\n", kind_name(kind), cell.prompt, cell.chunk,
                  cell.chunk < cell.prompt ? "yes" : "no", total_ms, tokens_s, flops / (total_ms * 1e-3) / 1e12);
      json << (first_row ? "" : ", ") << "{\"kv\": \"" << kind_name(kind) << "\", \"prompt\": " << cell.prompt
           << ", \"chunk\": " << cell.chunk << ", \"ms\": " << total_ms << ", \"tokens_s\": " << tokens_s
           << ", \"tflop_s\": " << flops / (total_ms * 1e-3) / 1e12 << "}";
      first_row = false;
    }
  }
  json << "], \"decode_groups\": [";

  // Decode by GQA group, each decode kernel: the group's query heads share each KV head's bytes,
  // so the bytes (and the copy-bandwidth bound) are the same at every group; only the work grows.
  using DecodeMath = cuda::PagedAttentionCudaOptions::DecodeMath;
  std::printf("\n%-5s %-5s %-5s %6s %6s %10s %9s %7s\n", "group", "kv", "math", "batch", "context", "us/call",
              "GB/s", "%copy");
  first_row = true;
  const int32_t group_batch = std::min(4, max_batch);
  std::vector<int32_t> group_contexts{4096, 8192, 16384, 32768};
  if (quick) group_contexts = {4096, 32768};
  if (one_context > 0) group_contexts = {one_context};
  cuda::PagedAttentionCudaLimits group_limits{group_batch, 8 * kKvHeads, kKvHeads, kHeadDim};
  const std::size_t group_workspace_bytes = cuda::paged_attention_cuda_workspace_bytes(group_limits);
  DeviceArray group_workspace(group_workspace_bytes);
  for (int32_t group : {1, 2, 4, 8}) {
    for (int32_t context : group_contexts) {
      if (int64_t{group_batch} * ((context + kBlock - 1) / kBlock) > pool_blocks) continue;  // --context beyond the pool
      const std::vector<int32_t> lens(static_cast<std::size_t>(group_batch), context);
      const std::vector<int32_t> ones(static_cast<std::size_t>(group_batch), 1);
      const Batch batch(lens, ones, pool_blocks, kv_bytes(lens, Kind::fp8), rng, group * kKvHeads);
      for (Kind kind : {Kind::fp8, Kind::bf16}) {
        for (DecodeMath math : {DecodeMath::simt, DecodeMath::mma}) {
          cuda::PagedAttentionCudaOptions options;
          options.decode_math = math;
          const int64_t bytes = kv_bytes(lens, kind);
          const int calls = static_cast<int>(std::clamp<int64_t>((int64_t{2} << 30) / bytes, 8, 200));
          const double ms = time_calls(batch, pools, kind, group_workspace.ptr, group_workspace_bytes, options, calls);
          const double gbs = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
          const char* math_name = math == DecodeMath::simt ? "simt" : "mma";
          std::printf("%-5d %-5s %-5s %6d %6d %10.1f %9.0f %6.1f%%\n", group, kind_name(kind), math_name, group_batch,
                      context, ms * 1e3, gbs, 100.0 * gbs * 1e9 / copy);
          json << (first_row ? "" : ", ") << "{\"group\": " << group << ", \"kv\": \"" << kind_name(kind)
               << "\", \"math\": \"" << math_name << "\", \"batch\": " << group_batch << ", \"context\": " << context
               << ", \"us\": " << ms * 1e3 << ", \"gb_s\": " << gbs << ", \"percent_of_copy\": " << 100.0 * gbs * 1e9 / copy
               << "}";
          first_row = false;
        }
      }
    }
  }
  json << "]}";
  std::printf("\njson: %s\n", json.str().c_str());
  return 0;
}
