#pragma once
// The geometry of the paged KV pool and its sizing from a byte budget. Plain numbers only:
// the cache does not know the model, the engine fills this in from the model's config.
#include <cstdint>
#include <string>

#include "cache/kv_window.hpp"
#include "kernels/kv_dtype.hpp"

namespace fp8serve {

struct KvCacheSpec {
  int block_size = kDefaultBlockSize;  // tokens per block
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  KvDtype dtype = KvDtype::fp8_e4m3;
  // The bf16 recent window (off by default); its block_size must equal the pool's.
  KvWindow window;

  // Throws std::invalid_argument naming the bad field (a window needs the FP8 dtype).
  void validate() const;

  // K and V of one token for every layer: num_layers * 2 * num_kv_heads * head_dim * elem.
  // fp8_e4m3 is exactly half of bf16; the per-sequence scales (2 floats per layer per
  // sequence, cache/kv_scales.hpp) live outside the pool.
  uint64_t bytes_per_token() const;
  uint64_t bytes_per_block() const { return bytes_per_token() * static_cast<uint64_t>(block_size); }

  // floor(budget / bytes_per_block), capped so that every slot id fits in int32
  // (num_blocks * block_size <= INT32_MAX). PRECOND: validate() passed.
  int num_blocks_for_budget(uint64_t budget_bytes) const;

  // One line for the start-up log: "1234 blocks x 16 tokens = 19744 tokens, 56.5 MiB, fp8_e4m3".
  std::string describe(int num_blocks) const;

  // The window's tail pool: one ring of window.ring_blocks() bf16 blocks per running sequence
  // (num_rings = --max-num-seqs), K and V (or K only) of every layer; 0 without a window.
  uint64_t tail_bytes_per_token() const;
  uint64_t tail_bytes(int num_rings) const;
  // "bf16 window 32 tokens (K+V): 64 rings x 3 blocks, 70.3 MiB, 23040 bytes/token", or "off".
  std::string describe_tail(int num_rings) const;

  // A KV budget split between the FP8 pool and the window's rings: as many rings as fit in
  // max_tail_share of the budget, at most max_rings (--max-num-seqs); none: no window (window
  // off in the result). The pool gets the rest; num_blocks 0 when it holds no block.
  struct BudgetSplit {
    int num_blocks = 0;
    int num_rings = 0;
    KvWindow window;  // the window in force
  };
  BudgetSplit split_budget(uint64_t budget_bytes, int max_rings, double max_tail_share) const;
};

}  // namespace fp8serve
