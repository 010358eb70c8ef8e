// SiLU·mul (SwiGLU), bias add and residual add: see kernels/cpu/ops.hpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC bug 105593 (_mm512_undefined_*)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <stdexcept>

#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

namespace {

// silu(g) * u over n elements, 16 at a time: exp(-g) by range reduction (n = round(x / ln 2),
// r = x - n ln 2 in two steps) and Cephes' degree-6 polynomial for e^r on [-ln2/2, ln2/2], within
// 1 ulp like std::exp (torch's vectorized exp is Sleef's, also within 1 ulp). Vectorized because
// scalar expf showed in the decode step (docs/cpu.md, "SiLU").
__attribute__((target("avx512f,fma"))) void silu_mul_row_avx512(const float* gate, const float* up, float* out,
                                                                 int64_t n) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), ln2_hi = _mm512_set1_ps(0.693359375f),
               ln2_lo = _mm512_set1_ps(-2.12194440e-4f), one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    // x = -g, clamped where expf over- or underflows (the results there are 0 and g exactly).
    const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(-87.3f)),
                                   _mm512_set1_ps(88.3f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, x);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 poly = _mm512_set1_ps(1.9875691500e-4f);
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
    poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(poly, r), r, r), one);
    const __m512 exp_x = _mm512_scalef_ps(e, k);  // e * 2^k
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp_x));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

}  // namespace

void silu_mul_cpu(const SiluMulParams& p, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.dim < 0) throw std::invalid_argument("silu_mul_cpu: bad shape");
  const int64_t gate_stride = p.gate_token_stride ? p.gate_token_stride : p.dim;
  const int64_t up_stride = p.up_token_stride ? p.up_token_stride : p.dim;
  const int64_t out_stride = p.out_token_stride ? p.out_token_stride : p.dim;
  const int64_t grain = 1 + 8192 / (p.dim > 0 ? p.dim : 1);
  const bool avx512 = cpu_features().avx512f && cpu_features().fma;
  parallel_chunks(pool, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = f32(p.gate) + t * gate_stride;
      const float* up = f32(p.up) + t * up_stride;
      float* out = f32(p.out) + t * out_stride;
      if (avx512) {
        silu_mul_row_avx512(gate, up, out, p.dim);
        continue;
      }
      for (int64_t i = 0; i < p.dim; ++i) {
        // torch's silu is x / (1 + exp(-x)); the product with up is a separate rounding.
        const float silu = gate[i] / (1.0f + std::exp(-gate[i]));
        out[i] = silu * up[i];
      }
    }
  });
}

void residual_add_cpu(const ResidualAddParams& p, ThreadPool& pool) {
  if (p.num_elements < 0) throw std::invalid_argument("residual_add_cpu: negative size");
  float* residual = f32(p.residual);
  const float* x = f32(p.x);
  parallel_chunks(pool, p.num_elements, 65536, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) residual[i] += x[i];
  });
}

}  // namespace fp8serve::cpu
