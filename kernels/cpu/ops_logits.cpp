// Greedy pick over logits rows: see kernels/cpu/ops.hpp.
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

void argmax_rows_cpu(const float* logits, int64_t num_rows, int64_t vocab_size, int32_t* out) {
  if (num_rows < 0 || vocab_size < 1 || vocab_size > INT32_MAX) {
    throw std::invalid_argument("argmax_rows_cpu: bad shape");
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* row = logits + r * vocab_size;
    int64_t best = 0;
    for (int64_t i = 1; i < vocab_size; ++i) {
      if (std::isnan(row[best])) break;  // a NaN wins and the first one stays
      if (std::isnan(row[i]) || row[i] > row[best]) best = i;
    }
    out[r] = static_cast<int32_t>(best);
  }
}

}  // namespace fp8serve::cpu
