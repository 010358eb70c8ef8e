#pragma once
// The element type of the paged KV pool. fp8_e4m3 is the production dtype (docs/design.md, "FP8 semantics");
// bf16 is the baseline every FP8 figure is compared against. Plain enough for device code:
// kernels switch on it once and call a launcher templated on the element type.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace fp8serve {

enum class KvDtype : uint8_t {
  fp8_e4m3,  // OCP E4M3FN, 1 byte, per-tensor scale (kernels/kv_scale_math.hpp)
  bf16,      // 2 bytes, no scale
};

// Bytes of one stored K or V element.
constexpr std::size_t kv_dtype_size(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp8_e4m3: return 1;
    case KvDtype::bf16: return 2;
  }
  return 0;  // unreachable for valid enumerators; callers validate parsed input
}

// True for dtypes whose stored values are divided by a per-sequence scale.
constexpr bool kv_dtype_is_scaled(KvDtype dtype) { return dtype == KvDtype::fp8_e4m3; }

// The spelling used by --kv-cache-dtype (vLLM's words) and in logs.
constexpr std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::fp8_e4m3: return "fp8_e4m3";
    case KvDtype::bf16: return "bf16";
  }
  return "unknown";
}

// Inverse of kv_dtype_name; nullopt for anything else.
constexpr std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
  if (name == "fp8_e4m3") return KvDtype::fp8_e4m3;
  if (name == "bf16") return KvDtype::bf16;
  return std::nullopt;
}

// --kv-rotation: an orthogonal transform of each head's q, k and v before the KV write, and of
// the attention output back after it, so FP8 stores rotated values (docs/fp8-kv-cache.md,
// "Rotation"). Scores are unchanged in exact arithmetic: (Hq).(Hk) = q.k for an orthogonal H.
enum class KvRotation : uint8_t {
  none,
  hadamard,  // the normalized Walsh-Hadamard transform (HeadHadamardParams, kernels/forward_ops.hpp)
};

constexpr std::string_view kv_rotation_name(KvRotation rotation) {
  return rotation == KvRotation::hadamard ? "hadamard" : "none";
}

}  // namespace fp8serve
