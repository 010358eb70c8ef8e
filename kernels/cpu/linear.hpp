#pragma once
// y = x @ W^T (+ bias) with bf16 weights and fp32 activations: every projection of the forward
// pass (qkv, o, gate/up, down, LM head) on the CPU.
//
// Exactly batch invariant. Every output element y[t, o] is computed by the same sequence of
// operations whatever the number of tokens, the tile it falls in, the thread that runs it or
// the instruction set (AVX-512, AVX2, scalar):
//   16 fp32 partial sums, lane j accumulating x[k] * w[k] for k = j, j + 16, j + 32, ... with
//   fused multiply-adds in increasing k; a last partial step over the in_features % 16 tail
//   with zeros in the missing lanes; then the fixed halving tree
//   (lane j + lane j+8), (j + j+4), (j + j+2), (j + j+1); then + bias.
// Tiling (several tokens x several weight rows per register tile) only decides which dot
// products are computed together, never how one is summed, so a greedy token is bitwise the
// same alone or in a batch of 8. That is why no BLAS is used here: OpenBLAS 0.3.21 (Debian)
// changes a row's result with the batch size (bench_linear: every checked row of the 1000-token
// down, q/o and k/v GEMMs differs from the same row computed alone), needs fp32 copies of the
// weights (twice the bytes for memory-bound decode) and was slower on every shape we measured.
//
// Not the AVX512-BF16 dot product (vdpbf16ps): about 2x the prefill GFLOP/s in bench_linear,
// but it rounds the activations to bf16 (output error ~6e-3 of the rms, vs ~1e-7 here), which
// DESIGN.md §4 keeps fp32 on the CPU; and batch-1 decode is bound by weight bytes, not FMAs.
#include <cstdint>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/forward_ops.hpp"

namespace fp8serve::cpu {

// Which vectorized path runs. `best` picks the widest the CPU has (cpu_features()); the others
// exist so tests can check that every path gives bitwise the same result, and throw
// std::runtime_error when the CPU lacks the instructions.
enum class LinearIsa { best, avx512, avx2, scalar };

// Activations are fp32 (kernels/cpu/ops.hpp). Throws std::invalid_argument on a bad shape.
void linear_cpu(const LinearParams& params, ThreadPool& pool, LinearIsa isa = LinearIsa::best);

// The path `best` resolves to on this CPU, for logs and benchmarks.
LinearIsa linear_best_isa();
const char* linear_isa_name(LinearIsa isa);

namespace detail {

// One ISA's kernel: computes rows [t_begin, t_end) x columns [o_begin, o_end) of y.
// PRECOND: p.x_stride and p.y_stride are set (not 0). Defined in linear_scalar.cpp,
// linear_avx2.cpp and linear_avx512.cpp.
void linear_block_scalar(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end);
void linear_block_avx2(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                       int64_t o_end);
void linear_block_avx512(const LinearParams& p, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end);

}  // namespace detail

}  // namespace fp8serve::cpu
