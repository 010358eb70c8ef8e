// The Walsh-Hadamard transform of each head (--kv-rotation hadamard): HeadHadamardParams in
// kernels/forward_ops.hpp gives the arithmetic every backend follows.
#include <stdexcept>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

namespace {

// One power-of-two segment of N elements, in place: the pairs (i, i + len) with i & len == 0 are
// those of each group of 2 * len, its first half against its second - contiguous runs the
// compiler vectorizes once len reaches a vector's width. N is a template argument for the sizes
// a head has (fully unrolled), 0 for any other.
template <int64_t N>
void hadamard_segment_f32(float* x, int64_t n, float scale) {
  if constexpr (N > 0) n = N;
  for (int64_t len = 1; len < n; len *= 2) {
    for (int64_t g = 0; g < n; g += 2 * len) {
      float* lo = x + g;
      float* hi = x + g + len;
      for (int64_t j = 0; j < len; ++j) {
        const float a = lo[j];
        const float b = hi[j];
        lo[j] = a + b;
        hi[j] = a - b;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

void transform_segment(float* x, int64_t n) {
  const float scale = hadamard_scale(n);
  switch (n) {
    case 64: return hadamard_segment_f32<64>(x, n, scale);
    case 128: return hadamard_segment_f32<128>(x, n, scale);
    default: return hadamard_segment_f32<0>(x, n, scale);
  }
}

}  // namespace

void head_hadamard_cpu(const HeadHadamardParams& p, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.num_heads < 0 || p.head_dim < 1) {
    throw std::invalid_argument("head_hadamard_cpu: bad shape");
  }
  const int64_t stride = p.token_stride ? p.token_stride : p.num_heads * p.head_dim;
  const int64_t per_token = p.num_heads * p.head_dim;
  const int64_t grain = 1 + 16384 / (per_token > 0 ? per_token : 1);
  parallel_chunks(pool, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < p.num_heads; ++h) {
        float* head = f32(p.x) + t * stride + h * p.head_dim;
        for (int64_t at = 0; at < p.head_dim;) {
          const int64_t n = hadamard_segment(p.head_dim - at);
          transform_segment(head + at, n);
          at += n;
        }
      }
    }
  });
}

}  // namespace fp8serve::cpu
