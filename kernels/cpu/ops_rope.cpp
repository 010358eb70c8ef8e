// RoPE: inv_freq as transformers derives it, the cos/sin table, and the rotation itself.
// See kernels/cpu/ops.hpp.
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

namespace {

// torch evaluates `base ** (arange(0, dim, 2).float() / dim)` in float32; its pow is within
// 1 ulp of the exact value, so the reference here is the exact value rounded once to float32
// (computed in double: the error before rounding is far below half an fp32 ulp).
float pow_f32(float base, float exponent) {
  return static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

// _compute_llama3_parameters, one element, each tensor operation rounded to float32 in the
// order torch performs it. `scalar / tensor` is reciprocal(tensor) * scalar in torch
// (Tensor.__rdiv__), so it is written that way here; python scalars meet float32 tensors as
// float32 values.
float llama3_scale(float inv_freq, const RopeConfig& c) {
  const float factor = static_cast<float>(c.factor);
  const float low_freq_factor = static_cast<float>(c.low_freq_factor);
  const double old_context_len = c.original_max_position_embeddings;
  const float low_freq_wavelen = static_cast<float>(old_context_len / c.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context_len / c.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);

  const float wavelen = (1.0f / inv_freq) * two_pi;
  const float scaled = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
  const float ratio = (1.0f / wavelen) * static_cast<float>(old_context_len);
  const float shifted = ratio - low_freq_factor;
  const float smooth = shifted / static_cast<float>(c.high_freq_factor - c.low_freq_factor);
  const float one_minus = 1.0f - smooth;
  const float low_part = (one_minus * scaled) / factor;
  const float high_part = smooth * scaled;
  const float smoothed = low_part + high_part;
  const bool is_medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
  return is_medium ? smoothed : scaled;
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& c) {
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > 65536) {
    throw std::invalid_argument("rope: rotary dim must be even and positive, got " +
                                std::to_string(c.rotary_dim));
  }
  if (!(c.theta > 0.0) || !std::isfinite(c.theta)) {
    throw std::invalid_argument("rope: rope_theta must be a positive number");
  }
  if (c.scaling == RopeScaling::llama3 &&
      !(c.factor > 0.0 && c.low_freq_factor > 0.0 && c.high_freq_factor > c.low_freq_factor &&
        c.original_max_position_embeddings > 0.0)) {
    throw std::invalid_argument(
        "rope: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
        "original_max_position_embeddings > 0");
  }
  const int64_t half = c.rotary_dim / 2;
  const float dim = static_cast<float>(c.rotary_dim);
  const float base = static_cast<float>(c.theta);
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    float value = 1.0f / pow_f32(base, exponent);
    if (c.scaling == RopeScaling::llama3) value = llama3_scale(value, c);
    inv_freq[static_cast<std::size_t>(i)] = value;
  }
  return inv_freq;
}

RopeTable make_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) {
  if (inv_freq.empty() || max_positions < 1) {
    throw std::invalid_argument("rope: empty inv_freq or max_positions < 1");
  }
  RopeTable table;
  table.max_positions = max_positions;
  table.half_dim = static_cast<int64_t>(inv_freq.size());
  const std::size_t size = static_cast<std::size_t>(max_positions * table.half_dim);
  table.cos.resize(size);
  table.sin.resize(size);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int64_t i = 0; i < table.half_dim; ++i) {
      // The fp32 product is the angle torch uses; large positions lose bits here exactly as
      // they do in transformers, so we keep the same (rounded) angle.
      const float angle = static_cast<float>(pos) * inv_freq[static_cast<std::size_t>(i)];
      const std::size_t at = static_cast<std::size_t>(pos * table.half_dim + i);
      table.cos[at] = static_cast<float>(std::cos(static_cast<double>(angle)));
      table.sin[at] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return table;
}

namespace {

// PRECOND: 2 * half <= head_dim.
void rotate_heads(float* x, int64_t num_heads, int64_t head_dim, const float* cos, const float* sin,
                  int64_t half) {
  for (int64_t h = 0; h < num_heads; ++h) {
    float* head = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float x0 = head[i];
      const float x1 = head[i + half];
      // Four separately rounded products, then one add each: q * cos + rotate_half(q) * sin.
      const float x0_cos = x0 * cos[i];
      const float x1_sin = x1 * sin[i];
      const float x1_cos = x1 * cos[i];
      const float x0_sin = x0 * sin[i];
      head[i] = x0_cos - x1_sin;
      head[i + half] = x1_cos + x0_sin;
    }
  }
}

}  // namespace

void rope_cpu(const RopeParams& p, const RopeTable& table, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.head_dim < 1 || p.num_q_heads < 0 || p.num_kv_heads < 0 ||
      2 * table.half_dim > p.head_dim) {
    throw std::invalid_argument("rope_cpu: bad shape or rotary dim larger than head_dim");
  }
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (p.positions[t] < 0 || p.positions[t] >= table.max_positions) {
      throw std::out_of_range("rope_cpu: position " + std::to_string(p.positions[t]) +
                              " outside the rope table (max " +
                              std::to_string(table.max_positions) + ")");
    }
  }
  const int64_t q_stride = p.q_token_stride ? p.q_token_stride : p.num_q_heads * p.head_dim;
  const int64_t k_stride = p.k_token_stride ? p.k_token_stride : p.num_kv_heads * p.head_dim;
  const int64_t per_token = (p.num_q_heads + p.num_kv_heads) * p.head_dim;
  const int64_t grain = 1 + 16384 / (per_token > 0 ? per_token : 1);
  parallel_chunks(pool, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t row = static_cast<int64_t>(p.positions[t]) * table.half_dim;
      const float* cos = table.cos.data() + row;
      const float* sin = table.sin.data() + row;
      if (p.q)
        rotate_heads(f32(p.q) + t * q_stride, p.num_q_heads, p.head_dim, cos, sin, table.half_dim);
      if (p.k)
        rotate_heads(f32(p.k) + t * k_stride, p.num_kv_heads, p.head_dim, cos, sin, table.half_dim);
    }
  });
}

}  // namespace fp8serve::cpu
