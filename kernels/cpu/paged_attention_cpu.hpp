#pragma once
// CPU paged attention over a flattened batch (kernels/paged_attention.hpp for the contract).
//
// Work split: one item per (sequence, KV head, query tile, key partition), run on the pool.
//  - A sequence with at most kQueryTile new tokens (decode, short chunks) is attended token by
//    token, each token exactly as its own decode step (so a speculative verification's rows are
//    bitwise the decodes'), and its context is cut into partitions of kPartitionTokens keys
//    (flash-decoding), so one long decode keeps every core busy; the partitions' (max, sum,
//    acc) are merged in order.
//  - A longer prefill chunk is cut into query tiles of kQueryTile tokens that each read their
//    whole causal range: plenty of items already, and no partial buffers the size of the chunk.
// The split depends only on the sequence itself (its length and chunk size), never on the
// batch or the thread count, and the merge order is fixed: every output is bit-identical
// whatever else shares the batch and however many threads run it.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/attention_item.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/paged_attention.hpp"

namespace fp8serve::cpu {

constexpr int32_t kQueryTile = 16;         // tokens per query tile of a long prefill chunk
constexpr int32_t kPartitionTokens = 256;  // keys per partition (rounded up to whole blocks)

// Which compiled item body to run. best = the widest the CPU supports and head_dim allows;
// asking for one the CPU or head_dim cannot run falls back to the next narrower one.
// avx512bf16 does the two matrix products on bf16 dot products (q and the probabilities
// rounded to bf16, K/V exact; attention_tile_avx512bf16.cpp), the others in fp32.
enum class CpuIsa { best, avx512bf16, avx512, avx2, scalar };

// Scratch reused across calls (the CPU backend owns one), so a step allocates nothing.
struct AttentionWorkspace {
  struct Work {
    AttentionItem item;
    int32_t seq = 0;
    int32_t kv_head = 0;
    int64_t out_offset = -1;  // partial items: where their o, m, l go in `partials`
    int64_t m_offset = -1;
    int64_t l_offset = -1;
  };
  struct Merge {
    int64_t scratch = 0;  // first float of the group's partials
    int32_t num_parts = 0;
    int32_t rows = 0;
    int32_t seq = 0;
    int32_t kv_head = 0;
    int32_t first_token = 0;  // of the rows merged
    int32_t context_len = 0;  // keys the rows' span sees
  };
  std::vector<Work> work;
  std::vector<Merge> merges;
  std::vector<float> partials;  // per merge: o [parts, rows, head_dim], m [parts, rows], l [parts, rows]
};

// Throws std::invalid_argument when the params break the contract (shapes, block ids out of
// range, context shorter than the chunk, non-positive scale): the pool is never read out of
// bounds, whatever the caller passes.
void validate_paged_attention(const PagedAttentionParams& params);

// PRECOND: kv_write for this step's tokens has run. Validates first (above).
void paged_attention_cpu(const PagedAttentionParams& params, ThreadPool& pool,
                         AttentionWorkspace& workspace, CpuIsa isa = CpuIsa::best);

// The instruction set `isa` resolves to on this CPU for this head_dim.
CpuIsa resolve_cpu_isa(CpuIsa isa, int32_t head_dim);
const char* cpu_isa_name(CpuIsa isa);  // "avx512bf16", ...
CpuIsa parse_cpu_isa(const std::string& name);  // the inverse; std::invalid_argument if unknown

}  // namespace fp8serve::cpu
