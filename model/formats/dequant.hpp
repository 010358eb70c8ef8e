#pragma once
// Scalar conversions (f16, bf16) and GGUF block dequantization to f32. Each type follows gguf-py's
// quants.py operation for operation (e.g. Q4_1 is `d * q + m`, Q4_K `(d * sc) * q - dmin * m`),
// so the results match the gguf package bit for bit; tests check that against vectors it
// generated. (The products of an f16 scale and a small integer are exact in f32, so an FMA would
// round the same; the library is still built with -ffp-contract=off to keep that reasoning
// unnecessary.)
#include <cstdint>
#include <span>

#include "model/formats/gguf.hpp"

namespace fp8serve {

float f16_to_f32(uint16_t bits);
float bf16_to_f32(uint16_t bits);
// Round to nearest even; NaN stays NaN (sign and top payload kept, quiet bit set), as ggml and
// ml_dtypes do. Values beyond bf16's range round to infinity.
uint16_t f32_to_bf16(float value);

// True for the tensor types dequantize_ggml implements.
bool can_dequantize(GgmlType type);
// PRECOND: dst.size() is a multiple of the type's block size and src.size() is exactly
// dst.size() / block_size * type_size (throws FormatError otherwise, or for other types).
void dequantize_ggml(GgmlType type, std::span<const uint8_t> src, std::span<float> dst);

}  // namespace fp8serve
