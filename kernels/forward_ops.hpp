#pragma once
// Params of the forward-pass ops of the Backend interface (kernels/backend.hpp), one struct
// per op, shared by every backend: the CPU ops (kernels/cpu/ops.hpp, linear.hpp) take these
// very structs. Their fields are documented here, the ops' arithmetic next to each op.
// Activations (`void*`) are in the backend's activation dtype (fp32 on the CPU, bf16 on the
// GPU); norm and embedding weights and biases are bf16 bits (std::uint16_t) as HF stores them;
// projection weights are bf16 or FP8 with scales (LinearParams). All pointers are device
// memory. A token stride of 0 means "densely packed".
#include <cmath>
#include <cstdint>
#include <stdexcept>

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

// Storage type of a projection's weights (LinearParams::weight).
enum class WeightDtype : uint8_t {
  bf16,      // bf16 bits, as Hugging Face stores them; no scales
  fp8_e4m3,  // E4M3FN codes (kernels/fp8.hpp), with fp32 scales (LinearParams::weight_scales)
};

// y = x @ W^T (+ bias). Batch invariant: y[t] does not depend on the other rows.
// PRECOND: y overlaps neither x nor the weights.
//
// The weights W are [out_features, in_features] row-major, in one of two representations, the
// same for every source and every backend:
//   bf16      W[o, k] = bf16 value of weight[o, k]; weight_scales is nullptr.
//   fp8_e4m3  W[o, k] = fp8_e4m3_decode(weight[o, k]) * weight_scales[o * num_k_blocks + k / block_k]
//             block_k = weight_block_k, or in_features when weight_block_k is 0 (one scale per
//             output channel); num_k_blocks = ceil(in_features / block_k). Scales are finite,
//             positive fp32.
// Where each comes from (model/weight_upload.cpp):
//   --quantization fp8 (and GGUF quantized tensors under it): per output channel,
//     scale = max(amax(row) / 448, FLT_MIN), codes = satfinite(RNE(W / scale)): the one
//     codec of kernels/fp8.hpp. Fused projections (qkv, gate_up) are concatenations of whole
//     rows, so quantizing per row commutes with the fusion.
//   FP8 checkpoints, per-tensor or per-channel weight_scale: per output channel, exactly (the
//     tensor scale repeated on every row).
//   FP8 checkpoints with 128 x 128 block scales (weight_scale_inv): weight_block_k = 128 and
//     the scale of block (o / 128, k / 128) repeated on each of the block's rows, exactly:
//     requantizing to one scale per row would round every weight a second time (docs/fp8-weights.md
//     measures what that would cost).
// A backend computes y[t, o] = sum_k x[t, k] * W[o, k] with fp32 (or wider) accumulation; how it
// rounds x on the way (the CPU's bf16 dot product does) is its own, documented next to its
// kernel. What every backend's linear() must honour for FP8 weights:
//   - codes are E4M3FN (OCP, bias 7, max 448), never a NaN code (0x7f / 0xff: the loaders refuse
//     them), row-major [out_features, in_features], in device memory like every other weight;
//   - weight_scales is fp32 [out_features, num_k_blocks] in device memory, every scale finite and
//     > 0; weight_block_k is 0 (one scale per row) or a multiple of 64, and the last block of a
//     row may be partial; the 2-D 128 x 128 block layout of a checkpoint is recovered by taking
//     every 128th row (true of every fused projection whose parts have multiple-of-128 rows, as
//     Qwen3-FP8's do);
//   - the dequantized W above is the reference (tests compare against it with dequantized
//     weights and double accumulation); y[t] must not depend on the other rows of the batch
//     (test_batching runs every prompt alone and in a batch and compares bitwise);
//   - Backend::supports_weight_dtype(fp8_e4m3) says whether linear() takes them: until it does,
//     the model refuses to load FP8 weights onto that backend with an error naming it.
// cuBLASLt maps onto this as its FP8 GEMM with an "outer vector" (per-row) scale for B, or its
// 128 x 128 block scales; a weight-only kernel for small batches converts codes in registers and
// folds the scale into each block's partial sums, as kernels/cpu/linear_avx512bf16.cpp does.
struct LinearParams {
  const void* x = nullptr;              // [num_tokens, in_features] (row stride x_stride)
  const void* weight = nullptr;         // [out_features, in_features] in weight_dtype
  WeightDtype weight_dtype = WeightDtype::bf16;
  const float* weight_scales = nullptr;  // fp8: [out_features, num_k_blocks] fp32
  int64_t weight_block_k = 0;           // fp8: inputs per scale, a multiple of 64; 0 = in_features
  const std::uint16_t* bias = nullptr;  // [out_features] bf16 or nullptr
  void* y = nullptr;                    // [num_tokens, out_features] (row stride y_stride)
  int64_t num_tokens = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t x_stride = 0;  // elements between rows of x; 0 = in_features
  int64_t y_stride = 0;  // elements between rows of y; 0 = out_features
  // y in fp32 whatever the activation dtype: the LM head's logits, which the sampler reads on
  // the host (a bf16 GPU backend writes them unrounded; the CPU's activations are fp32 anyway).
  bool y_fp32 = false;
};

// Scales per weight row of an FP8 projection: 1 per output channel, or one per block of
// weight_block_k inputs.
inline int64_t weight_num_k_blocks(int64_t in_features, int64_t weight_block_k) {
  return weight_block_k <= 0 ? 1 : (in_features + weight_block_k - 1) / weight_block_k;
}

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
  // --kv-rotation fused in: after RoPE, head_hadamard (below) over the first rotate_heads heads
  // of each token's q row (q | k | v of a fused qkv tensor), with the results of a rope call
  // followed by a head_hadamard call on the same row. 0: RoPE only. k, if given, must be the
  // heads right after q's in that row (rope_rotation checks it).
  int64_t rotate_heads = 0;
};

// x[t, h] = H x[t, h] in place, for every head h of every token t: H the normalized
// Walsh-Hadamard transform of --kv-rotation hadamard (kernels/kv_dtype.hpp). H is symmetric and
// orthogonal, so H H = I and the same op rotates back.
//
// A head_dim that is not a power of two is cut into power-of-two segments, largest first
// (96 = 64 + 32, 80 = 64 + 16), and each segment is transformed on its own: H is block
// diagonal, still orthogonal and its own inverse. Arithmetic, the same on every backend so
// that they agree bit for bit on the same fp32 inputs: for a segment of n elements, the
// butterfly stages len = 1, 2, 4, .., n / 2 in that order, each (a, b) = (x[i], x[i + len]) for
// i with (i & len) == 0 becoming (a + b, a - b) in fp32; then every element times
// hadamard_scale(n) = fp32(1 / sqrt(n)), one rounding. A bf16 backend widens its input to fp32
// and rounds the result once.
struct HeadHadamardParams {
  void* x = nullptr;  // [num_tokens, num_heads, head_dim] (token stride token_stride)
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t token_stride = 0;  // elements between tokens; 0 = num_heads * head_dim
};

// The segment sizes and scales of HeadHadamardParams: the largest power of two <= n, and
// fp32(1 / sqrt(n)) computed in double and rounded once.
constexpr int64_t hadamard_segment(int64_t remaining) {
  int64_t n = 1;
  while (2 * n <= remaining) n *= 2;
  return n;
}
inline float hadamard_scale(int64_t n) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))); }

// The head_hadamard call that RopeParams::rotate_heads fuses into a rope call, for a backend
// whose activations are `elem_bytes` wide. Throws std::invalid_argument where the span does not
// start at q, leaves out a RoPE'd head or runs past q's row.
inline HeadHadamardParams rope_rotation(const RopeParams& p, int64_t elem_bytes) {
  const int64_t q_width = p.num_q_heads * p.head_dim;
  const int64_t stride = p.q_token_stride ? p.q_token_stride : q_width;
  const int64_t k_stride = p.k_token_stride ? p.k_token_stride : p.num_kv_heads * p.head_dim;
  const bool k_follows = p.k == nullptr || (static_cast<const char*>(p.k) == static_cast<const char*>(p.q) + q_width * elem_bytes &&
                                            k_stride == stride);
  const int64_t roped = p.num_q_heads + (p.k ? p.num_kv_heads : 0);
  if (p.q == nullptr || !k_follows || p.rotate_heads < roped || p.rotate_heads * p.head_dim > stride) {
    throw std::invalid_argument("rope: rotate_heads must cover q and k, which must be one row with k after q");
  }
  HeadHadamardParams h;
  h.x = p.q;
  h.num_tokens = p.num_tokens;
  h.num_heads = p.rotate_heads;
  h.head_dim = p.head_dim;
  h.token_stride = stride;
  return h;
}

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
