#include "model/formats/dequant.hpp"

#include <cmath>
#include <cstring>
#include <string>

namespace fp8serve {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float load_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

// The 6-bit scales and mins of Q4_K / Q5_K (ggml's get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* s, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// One function per block type: (block bytes) -> block_size floats.
void block_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void block_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0xF) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

void block_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

void block_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

void block_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {  // 8 sub-blocks of 32: chunk j/2 of qs, nibble j%2
    uint8_t sc, m;
    scale_min_k4(j, scales, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      y[j * 32 + l] = dj * static_cast<float>((q[l] >> shift) & 0xF) - mj;
    }
  }
}

void block_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    scale_min_k4(j, scales, &sc, &m);
    const float dj = d * static_cast<float>(sc);
    const float mj = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
      y[j * 32 + l] = dj * static_cast<float>(v) - mj;
    }
  }
}

void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, r = e % 128;
    const int lo = (ql[half * 64 + r % 64] >> (4 * (r / 64))) & 0xF;
    const int hi = (qh[half * 32 + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(sc[e / 16]);
    y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::q4_0: return block_q4_0;
    case GgmlType::q4_1: return block_q4_1;
    case GgmlType::q5_0: return block_q5_0;
    case GgmlType::q5_1: return block_q5_1;
    case GgmlType::q8_0: return block_q8_0;
    case GgmlType::q4_k: return block_q4_k;
    case GgmlType::q5_k: return block_q5_k;
    case GgmlType::q6_k: return block_q6_k;
    default: return nullptr;
  }
}

}  // namespace

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float v = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

float bf16_to_f32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}

uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  }
  // Adding 0x7FFF plus the lowest kept bit rounds half to even; a carry into the exponent is the
  // correct rounding up (to infinity at the top of the range).
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

bool can_dequantize(GgmlType type) {
  return type == GgmlType::f32 || type == GgmlType::f16 || type == GgmlType::bf16 ||
         block_fn(type) != nullptr;
}

void dequantize_ggml(GgmlType type, std::span<const uint8_t> src, std::span<float> dst) {
  if (!can_dequantize(type)) {
    throw FormatError("GGUF: tensor type " + std::string(ggml_type_name(type)) +
                      " cannot be dequantized (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                      "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  }
  const auto block = static_cast<size_t>(ggml_block_size(type));
  const auto type_size = static_cast<size_t>(ggml_type_size(type));
  if (dst.size() % block != 0 || src.size() != dst.size() / block * type_size) {
    throw FormatError("GGUF: " + std::string(ggml_type_name(type)) + " data of " +
                      std::to_string(src.size()) + " bytes does not hold " +
                      std::to_string(dst.size()) + " elements");
  }
  if (dst.empty()) return;
  const uint8_t* s = src.data();
  float* y = dst.data();
  switch (type) {
    case GgmlType::f32:
      std::memcpy(y, s, src.size());
      return;
    case GgmlType::f16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = f16_to_f32(load_u16(s + 2 * i));
      return;
    case GgmlType::bf16:
      for (size_t i = 0; i < dst.size(); ++i) y[i] = bf16_to_f32(load_u16(s + 2 * i));
      return;
    default:
      break;
  }
  const BlockFn fn = block_fn(type);
  const size_t num_blocks = dst.size() / block;
  for (size_t i = 0; i < num_blocks; ++i) fn(s + i * type_size, y + i * block);
}

}  // namespace fp8serve
