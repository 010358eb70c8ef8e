#pragma once
// The bf16 recent window (--kv-bf16-window, docs/design.md, "The bf16 window"): each running sequence keeps its newest
// tokens exact in a small bf16 tail pool, and quantizes a block with its frozen FP8 scale only
// when the whole block has left the window. Plain numbers only: the rule that says which
// positions are FP8, and the tail's geometry. The kernels' side of the contract is in
// kernels/paged_kv.hpp; the block manager applies the rule per sequence.
#include <stdexcept>
#include <string>

#include "kernels/paged_kv.hpp"

namespace fp8serve {

struct KvWindow {
  int tokens = 0;         // the window, a multiple of block_size; 0 = off (every token FP8)
  bool values = true;     // V kept exact too; false: K only (half the tail, V always FP8)
  int block_size = kDefaultBlockSize;

  bool enabled() const { return tokens > 0; }
  // Tail blocks per sequence: the newest `tokens` tokens plus the partial block before them.
  int ring_blocks() const { return enabled() ? tokens / block_size + 1 : 0; }
  // Positions [0, fp8_len) of a context of context_len tokens have left the window: the whole
  // blocks that hold none of the newest `tokens` tokens. The tail holds the rest: at least
  // min(context_len, tokens) and fewer than tokens + block_size positions.
  int fp8_len(int context_len) const {
    if (!enabled() || context_len <= tokens) return enabled() ? 0 : context_len;
    return (context_len - tokens) / block_size * block_size;
  }

  // Throws std::invalid_argument: negative, or not a multiple of block_size.
  void validate() const {
    if (block_size <= 0) throw std::invalid_argument("KvWindow: block_size must be > 0");
    if (tokens < 0 || tokens % block_size != 0) {
      throw std::invalid_argument("--kv-bf16-window must be a multiple of the block size (" +
                                  std::to_string(block_size) + "), got " + std::to_string(tokens));
    }
  }
};

}  // namespace fp8serve
