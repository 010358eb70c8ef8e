#pragma once
// How the vectorized linear kernels walk their share of the output (kernels/cpu/linear.hpp), shared
// by linear_avx2.cpp, linear_avx512.cpp and linear_avx512bf16.cpp: which dot products go into one
// register tile, and in which order weight rows are read. None of it changes how a dot product is
// summed (that is the tile's business, the same for every tile shape), so results stay batch
// invariant. Plain code (no intrinsics): each kernel file supplies its tiles.
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/ops.hpp"

namespace fp8serve::cpu::detail {

// One register tile's inputs: R token rows (of x, or of the bf16 copy of x) against C weight rows.
template <typename W>
struct TileArgs {
  const float* x = nullptr;              // fp32 dot: the tile's first token row
  const std::uint16_t* x_bf16 = nullptr;  // bf16 dot: the same row rounded to bf16
  int64_t x_stride = 0;                  // elements between token rows (of x or x_bf16)
  const W* const* rows = nullptr;        // [C] weight rows (bf16 bits or FP8 codes)
  const float* const* scales = nullptr;  // [C] rows of FP8 scales, [num_k_blocks] each
  int64_t k = 0;                         // in_features
  int64_t block_k = 0;                   // inputs per scale (in_features when one per row)
  int64_t prefetch_bytes = 0;            // how far ahead of the read each row is prefetched
};

// Where each of a tile's C rows is prefetched from: prefetch_bytes past its start (the tiles add
// the read position).
template <typename W, int C>
inline void prefetch_starts(const TileArgs<W>& a, std::uintptr_t (&out)[C]) {
  for (int c = 0; c < C; ++c) {
    out[c] = reinterpret_cast<std::uintptr_t>(a.rows[c]) + static_cast<std::uintptr_t>(a.prefetch_bytes);
  }
}

// Tiles::run<W, R, C>(args, dots) computes dots[r * C + c] for r < R, c < C. Batch 1 reads
// kGemvCols rows side by side, larger batches use tiles of up to kRows x kCols.
template <class Tiles, int kRows, int kCols, int kGemvCols = kCols>
struct TileWalk {
  const LinearJob& job;
  int64_t prefetch_tiles;      // GEMM: prefetch the rows this many tiles further on
  int64_t gemv_prefetch_rows;  // batch 1: prefetch this many rows ahead in each segment

  void run(int64_t t_begin, int64_t t_end, int64_t o_begin, int64_t o_end) const {
    if (job.p.weight_dtype == WeightDtype::fp8_e4m3) {
      run_typed<std::uint8_t>(t_begin, t_end, o_begin, o_end);
    } else {
      run_typed<std::uint16_t>(t_begin, t_end, o_begin, o_end);
    }
  }

 private:
  template <typename W>
  using TileFn = void (*)(const TileArgs<W>&, float*);

  template <typename W>
  struct Table {
    TileFn<W> fn[kRows][kCols];  // fn[rows - 1][cols - 1]
    TileFn<W> gemv[kGemvCols];   // gemv[cols - 1], one token
  };

  template <typename W, int R, int... Cs>
  static constexpr void fill_row(Table<W>& table, std::integer_sequence<int, Cs...>) {
    ((table.fn[R - 1][Cs] = &Tiles::template run<W, R, Cs + 1>), ...);
  }
  template <typename W, int... Cs>
  static constexpr void fill_gemv(Table<W>& table, std::integer_sequence<int, Cs...>) {
    ((table.gemv[Cs] = &Tiles::template run<W, 1, Cs + 1>), ...);
  }

  template <typename W, int... Rs>
  static constexpr Table<W> make_table(std::integer_sequence<int, Rs...>) {
    Table<W> table{};
    (fill_row<W, Rs + 1>(table, std::make_integer_sequence<int, kCols>{}), ...);
    fill_gemv<W>(table, std::make_integer_sequence<int, kGemvCols>{});
    return table;
  }

  template <typename W>
  void run_typed(int64_t t_begin, int64_t t_end, int64_t o_begin, int64_t o_end) const {
    // tiles.fn[rows - 1][cols - 1]: the tile for a partial block at the batch or output edge.
    static constexpr Table<W> tiles = make_table<W>(std::make_integer_sequence<int, kRows>{});
    const LinearParams& p = job.p;
    const auto* weight = static_cast<const W*>(p.weight);
    const int64_t row_bytes = p.in_features * static_cast<int64_t>(sizeof(W));
    constexpr int kMaxCols = kCols > kGemvCols ? kCols : kGemvCols;
    float dots[kRows * kMaxCols];
    const W* rows[kMaxCols];
    const float* scales[kMaxCols];
    int64_t outs[kMaxCols];
    TileArgs<W> a;
    a.rows = rows;
    a.scales = scales;
    a.k = p.in_features;
    a.block_k = p.weight_block_k;
    auto set_row = [&](int c, int64_t o) {
      outs[c] = o;
      rows[c] = weight + o * p.in_features;
      scales[c] = p.weight_scales ? p.weight_scales + o * job.num_k_blocks : nullptr;
    };
    auto point_at = [&](int64_t t) {
      a.x = f32(p.x) + t * p.x_stride;
      a.x_stride = p.x_stride;
      if (job.x_bf16 != nullptr) {
        a.x_bf16 = job.x_bf16 + t * job.x_bf16_stride;
        a.x_stride = job.x_bf16_stride;
      }
    };
    auto store = [&](int64_t t, int num_rows, int num_cols) {
      for (int r = 0; r < num_rows; ++r) {
        float* y = f32(p.y) + (t + r) * p.y_stride;
        for (int c = 0; c < num_cols; ++c) {
          const float dot = dots[r * num_cols + c];
          y[outs[c]] = p.bias ? dot + bf16_to_float(p.bias[outs[c]]) : dot;
        }
      }
    };
    if (t_end - t_begin == 1) {
      // One token (batch-1 decode): the weights are read once and DRAM bound. The block is cut
      // into kGemvCols contiguous segments read side by side, each walking its rows in memory
      // order: a few long sequential streams, which the prefetchers follow at full speed.
      const int64_t n = o_end - o_begin;
      const int64_t per_segment = (n + kGemvCols - 1) / kGemvCols;
      point_at(t_begin);
      a.prefetch_bytes = gemv_prefetch_rows * row_bytes;
      for (int64_t r = 0; r < per_segment; ++r) {
        int cols = 0;
        for (int s = 0; s < kGemvCols; ++s) {
          const int64_t o = o_begin + s * per_segment + r;
          if (o < o_end) set_row(cols++, o);
        }
        tiles.gemv[cols - 1](a, dots);
        store(t_begin, 1, cols);
      }
      return;
    }
    for (int64_t o = o_begin; o < o_end; o += kCols) {
      const int cols = static_cast<int>(o_end - o < kCols ? o_end - o : kCols);
      for (int c = 0; c < cols; ++c) set_row(c, o + c);
      // A tile's rows are contiguous: prefetch the rows prefetch_tiles tiles further on.
      a.prefetch_bytes = prefetch_tiles * cols * row_bytes;
      for (int64_t t = t_begin; t < t_end; t += kRows) {
        const int num_rows = static_cast<int>(t_end - t < kRows ? t_end - t : kRows);
        point_at(t);
        tiles.fn[num_rows - 1][cols - 1](a, dots);
        store(t, num_rows, cols);
      }
    }
  }
};

}  // namespace fp8serve::cpu::detail
