#pragma once
// The FP8 KV scale arithmetic (docs/design.md, "The FP8 KV contract"), shared by the kernels that write the pool and
// the host code that keeps the scales (cache/kv_scales.hpp).
//
// Scales are per tensor: one float for K and one for V, per layer, per sequence. kv_write
// calibrates them on a sequence's first prefill chunk with calibrate_kv_scale(), the block
// manager freezes them when that chunk is committed, and every later token of the sequence is
// quantized as q = fp8_e4m3_encode(x / scale). Plain inline code, usable from host and device.
#include <cfloat>
#include <cstdint>
#include <stdexcept>

#include "kernels/fp8.hpp"

namespace fp8serve {

// 1.0 reproduces the seed (the transformers QuantizedCache FP8 backend) exactly. The default is
// 4.0: exactly twice 2.0's scale, so every normal value keeps 2.0's E4M3 mantissa and the KL is
// 2.0's, with twice the headroom - short prompts saturate none where 2.0 saturated ~1e-8 of the
// decode elements (figures: docs/fp8-kv-cache.md, "Choosing `--kv-scale-margin`").
constexpr float kDefaultKvScaleMargin = 4.0f;

// scale = max(amax * margin / 448, FLT_MIN): the calibration amax maps to 448 / margin, so
// margin > 1 leaves headroom for later tokens. Never zero (an all-zero prefill must not divide
// by zero later). A NaN amax (a broken model) is treated as 0; an infinite one gives the
// largest finite scale, so finite values quantize to ~0 and infinities to ±448 — garbage in,
// but no NaN scale. PRECOND: margin finite and > 0 (validate_kv_scale_margin).
FP8_HD float calibrate_kv_scale(float amax, float margin) {
  if (!(amax > 0.0f)) return FLT_MIN;  // also catches NaN
  const float scale = amax * margin / kFp8E4m3Max;
  if (!(scale <= FLT_MAX)) return FLT_MAX;
  return scale < FLT_MIN ? FLT_MIN : scale;
}

// An element "saturates" when the frozen scale maps it beyond what FP8 rounding alone would
// give: |x / scale| > 464 (448 plus half an ulp), where the encoder's clamp to ±448 changes the
// result. That is the event the seed measured (a decode token beyond the calibrated amax).
// Values in (448, 464] round to 448 as any other value rounds, so the calibration amax itself,
// which float arithmetic may put a hair above 448, is never counted. NaN is not counted.
constexpr float kFp8SaturationThreshold = 464.0f;

FP8_HD bool kv_value_saturates(float x_over_scale) {
  return x_over_scale > kFp8SaturationThreshold || x_over_scale < -kFp8SaturationThreshold;
}

// Throws std::invalid_argument for a margin calibrate_kv_scale cannot use (the Transformer checks
// its option with it, kv_write before it calibrates).
inline void validate_kv_scale_margin(float margin) {
  if (!(margin > 0.0f) || !(margin <= FLT_MAX)) {
    throw std::invalid_argument("--kv-scale-margin must be a finite number > 0 (1.0 = seed)");
  }
}

// What one kv_write (or kv_spill) call reports for one layer: elements written to the main
// pool. Without a bf16 window K and V write the same number; with one, the tail's bf16 writes
// are not counted here and a K-only window writes V rows to the pool before their K.
struct KvWriteCounts {
  uint64_t num_elements = 0;     // K elements written to the pool
  uint64_t num_k_saturated = 0;  // K elements with |x / k_scale| > 464
  uint64_t num_v_saturated = 0;  // V elements with |x / v_scale| > 464
  uint64_t num_v_elements = 0;   // V elements written to the pool

  KvWriteCounts& operator+=(const KvWriteCounts& other) {
    num_elements += other.num_elements;
    num_v_elements += other.num_v_elements;
    num_k_saturated += other.num_k_saturated;
    num_v_saturated += other.num_v_saturated;
    return *this;
  }
  bool operator==(const KvWriteCounts&) const = default;
};

}  // namespace fp8serve
