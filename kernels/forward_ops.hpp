#pragma once
// Params of the forward-pass ops of the Backend interface (kernels/backend.hpp), one struct
// per op, shared by every backend: the CPU ops (kernels/cpu/ops.hpp, linear.hpp) take these
// very structs. Their fields are documented here, the ops' arithmetic next to each op.
// Activations (`void*`) are in the backend's activation dtype (fp32 on the CPU, bf16 on the
// GPU); weights are bf16 bits (std::uint16_t) as HF stores them, [out, in] row-major. All
// pointers are device memory. A token stride of 0 means "densely packed".
#include <cstdint>

#include "kernels/paged_kv.hpp"

namespace fp8serve {

// out[t] = table[token_ids[t]]. Ids can come from a client (prompt token ids): one outside
// [0, vocab_size) is an error, never a wild read.
struct EmbeddingParams {
  const std::uint16_t* table = nullptr;  // [vocab_size, hidden] bf16
  const int32_t* token_ids = nullptr;    // [num_tokens]
  void* out = nullptr;                   // [num_tokens, hidden]
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t hidden = 0;
};

// out = weight * (x * rsqrt(mean(x^2) + eps)) per row of `dim` elements. Two uses:
//   whole hidden rows:   num_heads = 1, dim = hidden_size
//   Qwen3 q/k norm:      rows are (token, head), dim = head_dim, one weight shared by all heads
// x may be a column slice of a wider tensor (q inside a fused qkv output): the token strides
// say how far apart tokens are; heads of one token are contiguous. out may alias x (in place).
//
// Fused with the residual add when `residual` is set (the residual stream between two blocks):
//   residual += x   (rounded to the activation dtype), then   out = norm(residual)
// so one pass reads the block's output and the stream and writes the updated stream and its
// norm. out may alias x or residual; residual must not overlap x.
struct RmsNormParams {
  const void* x = nullptr;                // [num_tokens, num_heads, dim]
  const std::uint16_t* weight = nullptr;  // [dim] bf16
  void* out = nullptr;                    // [num_tokens, num_heads, dim]
  void* residual = nullptr;               // [num_tokens, num_heads, dim] or nullptr: plain norm
  int64_t num_tokens = 0;
  int64_t num_heads = 1;
  int64_t dim = 0;
  int64_t x_token_stride = 0;         // elements between tokens in x; 0 = num_heads * dim
  int64_t out_token_stride = 0;       // elements between tokens in out; 0 = num_heads * dim
  int64_t residual_token_stride = 0;  // elements between tokens in residual; 0 = num_heads * dim
  float eps = 1e-6f;
};

// y = x @ weight^T (+ bias). Batch invariant: y[t] does not depend on the other rows.
// PRECOND: y overlaps neither x nor the weights.
struct LinearParams {
  const void* x = nullptr;                // [num_tokens, in_features] (row stride x_stride)
  const std::uint16_t* weight = nullptr;  // [out_features, in_features] bf16
  const std::uint16_t* bias = nullptr;    // [out_features] bf16 or nullptr
  void* y = nullptr;                      // [num_tokens, out_features] (row stride y_stride)
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t x_stride = 0;  // elements between rows of x; 0 = in_features
  int64_t y_stride = 0;  // elements between rows of y; 0 = out_features
  // y in fp32 whatever the activation dtype: the LM head's logits, which the sampler reads on
  // the host (a bf16 GPU backend writes them unrounded; the CPU's activations are fp32 anyway).
  bool y_fp32 = false;
};

// RoPE (HF rotate_half layout) on q and k in place, with the table of set_rope_table(). q and
// k may be column slices of a fused qkv tensor (token strides); k may be nullptr (q only).
struct RopeParams {
  void* q = nullptr;                   // [num_tokens, num_q_heads, head_dim]
  void* k = nullptr;                   // [num_tokens, num_kv_heads, head_dim] or nullptr
  const int32_t* positions = nullptr;  // [num_tokens], each in [0, max_positions)
  int64_t num_tokens = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t q_token_stride = 0;  // 0 = num_q_heads * head_dim
  int64_t k_token_stride = 0;  // 0 = num_kv_heads * head_dim
};

// out = silu(gate) * up (SwiGLU). gate and up may be the two halves of a fused gate_up
// projection (token strides); out may alias gate.
struct SiluMulParams {
  const void* gate = nullptr;  // [num_tokens, dim]
  const void* up = nullptr;    // [num_tokens, dim]
  void* out = nullptr;         // [num_tokens, dim]
  int64_t num_tokens = 0;
  int64_t dim = 0;
  int64_t gate_token_stride = 0;  // 0 = dim
  int64_t up_token_stride = 0;    // 0 = dim
  int64_t out_token_stride = 0;   // 0 = dim
};

// residual += x over num_elements elements (the residual stream).
struct ResidualAddParams {
  void* residual = nullptr;  // [num_elements]
  const void* x = nullptr;   // [num_elements]
  int64_t num_elements = 0;
};

// out[i] = x[rows[i]]: the rows that sample this step, so the LM head runs only on them.
struct GatherRowsParams {
  const void* x = nullptr;        // [num_x_rows, dim]
  const int32_t* rows = nullptr;  // [num_rows], each in [0, num_x_rows)
  void* out = nullptr;            // [num_rows, dim]
  int64_t num_x_rows = 0;
  int64_t num_rows = 0;
  int64_t dim = 0;
};

// Copy-on-write of paged KV blocks in every layer: pools[layer] block src -> block dst, K and V
// (K alone where the view's v is null: a K-only bf16 tail pool, kernels/paged_kv.hpp).
struct CopyBlocksParams {
  const PagedKvView* layers = nullptr;  // [num_layers] host array of views (device pointers)
  int32_t num_layers = 0;
  const int32_t* src = nullptr;  // [num_copies] host
  const int32_t* dst = nullptr;  // [num_copies] host
  int32_t num_copies = 0;
};

}  // namespace fp8serve
