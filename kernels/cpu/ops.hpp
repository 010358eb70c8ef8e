#pragma once
// The CPU backend's small ops of the forward pass: RMSNorm (whole rows and per head), RoPE,
// SiLU·mul, embedding lookup, residual add, row gather and argmax.
//
// Activations are fp32, weights bf16 (std::uint16_t holding the upper half of an fp32), and the
// arithmetic follows what transformers does in fp32 on the same bf16-rounded weights, step for
// step where that is cheap (RoPE and SiLU round each product as torch does), so the forward pass
// can be checked against it tightly. These ops are a few percent of a step next to the
// projections (kernels/cpu/linear.hpp): they are written as plain loops the compiler vectorizes,
// threaded over rows, and each row's result never depends on the other rows of the batch.
//
// Shapes use the flattened batch: num_tokens rows, one per token of the step (prefill chunks and
// decode tokens together). Each op takes the params struct of kernels/forward_ops.hpp, which
// documents the fields (shapes, strides, aliasing), plus whatever only the CPU needs.
#include <cstdint>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/forward_ops.hpp"

namespace fp8serve::cpu {

// bf16 <-> fp32 through the one codec of kernels/bf16.hpp. Widening is exact (bf16 is the upper
// half of an fp32); narrowing rounds to nearest even and keeps NaN a NaN.
inline float bf16_to_float(std::uint16_t bits) { return bf16_decode(bits); }
inline std::uint16_t float_to_bf16(float value) { return bf16_encode(value); }

// The params structs hold activations as `void*` in the backend's activation dtype, which is
// fp32 on the CPU (ActDtype::f32): the CPU ops read them through these casts.
inline const float* f32(const void* p) { return static_cast<const float*>(p); }
inline float* f32(void* p) { return static_cast<float*>(p); }

// Runs fn(begin, end) over [0, n) in chunks of about `grain` items on the pool. The chunking
// only decides who computes a row, never how: results do not depend on it.
template <typename Fn>
void parallel_chunks(ThreadPool& pool, int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  const int64_t num_chunks = (n + grain - 1) / grain;
  if (num_chunks == 1 || pool.num_threads() == 1) {
    fn(int64_t{0}, n);
    return;
  }
  pool.parallel_for(num_chunks, [&](int64_t chunk) {
    const int64_t begin = chunk * grain;
    fn(begin, begin + grain < n ? begin + grain : n);
  });
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: out = weight * (x * rsqrt(mean(x^2) + eps)), per row of `dim` elements, in that
// order of operations (LlamaRMSNorm / Qwen3RMSNorm in fp32). With params.residual set, first
// residual += x, then the norm of the updated residual: bitwise what residual_add_cpu followed
// by rms_norm_cpu on the residual gives.
void rms_norm_cpu(const RmsNormParams& params, ThreadPool& pool);

// ---------------------------------------------------------------------------------------------
// RoPE in the Hugging Face "rotate_half" layout: element i of a head pairs with i + rotary_dim/2.
//   out[i]       = x[i] * cos[p][i] - x[i + half] * sin[p][i]
//   out[i + half] = x[i + half] * cos[p][i] + x[i] * sin[p][i]
// each product rounded separately, as torch evaluates q * cos + rotate_half(q) * sin.
// Note for GGUF: llama.cpp's converter permutes Llama's q/k weights into the interleaved pair
// layout; the loader must undo that permutation so these weights see the HF layout.

// How inv_freq is derived (the model config's rope_theta / rope_scaling).
enum class RopeScaling { none, llama3 };

struct RopeConfig {
  int64_t rotary_dim = 0;  // head_dim (times partial_rotary_factor, 1 for Llama/Qwen)
  double theta = 10000.0;  // rope_theta
  RopeScaling scaling = RopeScaling::none;
  // llama3 rope scaling (Llama 3.1 / 3.2): ignored when scaling == none.
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// inv_freq[rotary_dim / 2] exactly as transformers' _compute_default_rope_parameters and
// _compute_llama3_parameters compute it: float32 tensors, python scalars rounded to float32,
// each operation rounded once. Throws std::invalid_argument for a config that makes no sense
// (odd or non-positive rotary_dim, theta <= 0, llama3 factors that divide by zero).
std::vector<float> rope_inv_freq(const RopeConfig& config);

// cos/sin for every position in [0, max_positions): [max_positions, rotary_dim / 2] each.
// The angle is float(position) * inv_freq rounded to fp32 (as torch), then cos/sin of that
// fp32 angle correctly rounded (torch's own cos/sin are within 1 ulp of it).
struct RopeTable {
  int64_t max_positions = 0;
  int64_t half_dim = 0;    // rotary_dim / 2
  std::vector<float> cos;  // [max_positions, half_dim]
  std::vector<float> sin;  // [max_positions, half_dim]
};
RopeTable make_rope_table(const std::vector<float>& inv_freq, int64_t max_positions);

// Rotates q and k in place with `table` (the CPU backend's copy of set_rope_table()). Only the
// first rotary_dim = 2 * table.half_dim elements of each head rotate.
// Throws std::out_of_range if a position is negative or >= table.max_positions.
void rope_cpu(const RopeParams& params, const RopeTable& table, ThreadPool& pool);

// The normalized Walsh-Hadamard transform of each head in place (HeadHadamardParams).
void head_hadamard_cpu(const HeadHadamardParams& params, ThreadPool& pool);

// ---------------------------------------------------------------------------------------------
// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) as torch computes it.
void silu_mul_cpu(const SiluMulParams& params, ThreadPool& pool);

// ---------------------------------------------------------------------------------------------
// Embedding lookup: out[t] = float(table[token_ids[t]]). Throws std::out_of_range for a token
// id outside [0, vocab_size), before writing anything.
void embedding_cpu(const EmbeddingParams& params, ThreadPool& pool);

// residual += x (the residual stream accumulates each block's output).
void residual_add_cpu(const ResidualAddParams& params, ThreadPool& pool);

// out[i] = x[rows[i]]. Throws std::out_of_range for a bad row index, before writing anything.
void gather_rows_cpu(const GatherRowsParams& params);

// Index of the largest logit of each row, the first one on ties and a NaN counting as the
// largest (torch.argmax's rules). logits: [num_rows, vocab_size]; out: [num_rows].
void argmax_rows_cpu(const float* logits, int64_t num_rows, int64_t vocab_size, int32_t* out);

}  // namespace fp8serve::cpu
