#pragma once
// bfloat16 <-> float for host and device code: the bf16 KV pool's codec. Encoding rounds to
// nearest, ties to even (what torch's .to(torch.bfloat16) and CUDA's __float2bfloat16_rn do);
// NaN stays a quiet NaN with its sign, infinities stay infinities.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BF16_HD __host__ __device__ __forceinline__
#else
#define BF16_HD inline
#endif

namespace fp8serve {

BF16_HD uint16_t bf16_encode(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  // Adding 0x7fff plus the lowest kept bit carries into the kept half exactly when the dropped
  // half is above one half, or equal to it with an odd kept value: round half to even.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

BF16_HD float bf16_decode(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace fp8serve
