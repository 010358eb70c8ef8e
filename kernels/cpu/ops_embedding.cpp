// Embedding lookup and row gather: see kernels/cpu/ops.hpp.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu {

void embedding_cpu(const EmbeddingParams& p, ThreadPool& pool) {
  if (p.num_tokens < 0 || p.vocab_size < 1 || p.hidden < 1) {
    throw std::invalid_argument("embedding_cpu: bad shape");
  }
  // Validate every id before writing anything, so a bad request leaves no half-written rows.
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (p.token_ids[t] < 0 || p.token_ids[t] >= p.vocab_size) {
      throw std::out_of_range("embedding: token id " + std::to_string(p.token_ids[t]) +
                              " outside the vocabulary [0, " + std::to_string(p.vocab_size) + ")");
    }
  }
  const int64_t grain = 1 + 16384 / p.hidden;
  parallel_chunks(pool, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const std::uint16_t* row = p.table + static_cast<int64_t>(p.token_ids[t]) * p.hidden;
      float* out = f32(p.out) + t * p.hidden;
      for (int64_t i = 0; i < p.hidden; ++i) out[i] = bf16_to_float(row[i]);
    }
  });
}

void gather_rows_cpu(const GatherRowsParams& p) {
  if (p.num_rows < 0 || p.dim < 0) throw std::invalid_argument("gather_rows_cpu: bad shape");
  for (int64_t i = 0; i < p.num_rows; ++i) {
    if (p.rows[i] < 0 || p.rows[i] >= p.num_x_rows) {
      throw std::out_of_range("gather_rows_cpu: row " + std::to_string(p.rows[i]) +
                              " outside [0, " + std::to_string(p.num_x_rows) + ")");
    }
  }
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const float* src = f32(p.x) + static_cast<int64_t>(p.rows[i]) * p.dim;
    std::copy(src, src + p.dim, f32(p.out) + i * p.dim);
  }
}

}  // namespace fp8serve::cpu
