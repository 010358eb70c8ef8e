#pragma once
// y = x @ W^T (+ bias) with fp32 activations and bf16 or FP8 weights (kernels/forward_ops.hpp,
// LinearParams): every projection of the forward pass (qkv, o, gate_up, down, LM head) on the CPU.
//
// Two arithmetics, one per kind of CPU, each exactly batch invariant: every output element
// y[t, o] is computed by the same sequence of operations whatever the number of tokens, the tile
// it falls in or the thread that runs it, so a greedy token is bitwise the same alone or in a
// batch of 8. Tiling only decides which dot products are computed together, never how one is
// summed.
//
// fp32 dot (ISAs scalar, avx2, avx512; CPUs without AVX512-BF16): x is used as it is.
//   The weight row is cut into blocks of block_k inputs (one block for bf16 weights and per-channel
//   FP8). Within a block, 16 fp32 partial sums: lane j accumulates x[k] * w[k] for the block's
//   k = j, j + 16, ... with fused multiply-adds in increasing k; a last partial step over the
//   block's % 16 tail with zeros in the missing lanes. bf16 weights: total = those partial sums.
//   FP8 weights enter as decode(q) * 2^-8 (exact: the fp16 trick of the FP8 attention) and each
//   block ends with total[j] = fma(partial[j], scale * 256, total[j]) from total = +0. Then the
//   fixed halving tree (lane j + lane j+8), (j + j+4), (j + j+2), (j + j+1); then + bias. All
//   three ISAs give bitwise the same result (tested).
//
// bf16 dot (ISA avx512bf16; needs AVX512-BF16 and AVX512-VBMI): x is rounded to bf16 (round to
//   nearest even, vcvtneps2bf16) once per call, W enters exactly (every bf16 and every E4M3 value
//   is a bf16 number), and vdpbf16ps multiplies pairs exactly and adds them in fp32: 32
//   multiply-adds per instruction, twice an fp32 FMA's 16. Rows are read in chunks of 64 inputs,
//   each two vdpbf16ps steps into 16 fp32 lanes (halves W0 then W1 of the chunk, fixed per weight
//   dtype: bf16 weights as stored, inputs 0-31 then 32-63; FP8 weights in the order the byte
//   table lookup produces them, x permuted to match), the tail chunk zero-padded. Blocks, scales,
//   the tree and the bias as above (FP8 scales unscaled: the table gives exact values). The
//   rounding of x to bf16 (relative error <= 2^-8 per element) is the only difference from the
//   fp32 arithmetic beyond the summation order; vdpbf16ps treats bf16 denormals (|x| < 1.2e-38)
//   as zero.
//
// Where the CPU has it, the bf16 dot runs everywhere (the engine never mixes the two), and bf16
// and FP8 weights alike: as every GPU engine computes with bf16 activations. docs/cpu.md,
// "CPU projections", measures what it costs in quality (bench_kv_quality) and buys in speed.
//
// No BLAS here: OpenBLAS 0.3.21 (Debian) changes a row's result with the batch size (bench_linear:
// every checked row of the 1000-token down, q/o and k/v GEMMs differs from the same row computed
// alone), needs fp32 copies of the weights (twice the bytes for memory-bound decode) and was
// slower on every shape we measured.
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/forward_ops.hpp"

namespace fp8serve::cpu {

// Which path runs. `best` picks avx512bf16 where the CPU has it, else the widest fp32 path
// (cpu_features()); the others exist so tests and benchmarks can run every path, and throw
// std::runtime_error when the CPU lacks the instructions.
enum class LinearIsa { best, avx512bf16, avx512, avx2, scalar };

// Scratch of the bf16 dot (x rounded to bf16), reused across calls: one per backend.
struct LinearWorkspace {
  std::vector<std::uint16_t> x_bf16;
};

// Activations are fp32 (kernels/cpu/ops.hpp). Throws std::invalid_argument on a bad shape, a
// missing FP8 scale array or a weight_block_k that is not a multiple of 64.
void linear_cpu(const LinearParams& params, ThreadPool& pool, LinearWorkspace& workspace,
                LinearIsa isa = LinearIsa::best);
// The same with a workspace of its own (tests, benchmarks).
void linear_cpu(const LinearParams& params, ThreadPool& pool, LinearIsa isa = LinearIsa::best);

// The path `best` resolves to on this CPU, for logs and benchmarks.
LinearIsa linear_best_isa();
// The widest fp32-dot path (x used as it is) on this CPU: references that must not round x.
LinearIsa linear_fp32_dot_isa();
bool linear_isa_supported(LinearIsa isa);
const char* linear_isa_name(LinearIsa isa);

namespace detail {

// A call after linear_cpu's checks: strides set (not 0), weight_block_k set (in_features for
// bf16 weights and per-channel FP8); x_bf16 only for the bf16 dot.
struct LinearJob {
  LinearParams p;
  int64_t num_k_blocks = 1;
  const std::uint16_t* x_bf16 = nullptr;  // [num_tokens, x_bf16_stride], see linear_avx512bf16.cpp
  int64_t x_bf16_stride = 0;
};

// One ISA's kernel: computes rows [t_begin, t_end) x columns [o_begin, o_end) of y. Defined in
// linear_scalar.cpp, linear_avx2.cpp, linear_avx512.cpp and linear_avx512bf16.cpp.
void linear_block_scalar(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end);
void linear_block_avx2(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                       int64_t o_end);
void linear_block_avx512(const LinearJob& job, int64_t t_begin, int64_t t_end, int64_t o_begin,
                         int64_t o_end);
void linear_block_avx512bf16(const LinearJob& job, int64_t t_begin, int64_t t_end,
                             int64_t o_begin, int64_t o_end);

// bf16 dot: rounds rows [t_begin, t_end) of x to bf16 into job.x_bf16, in the order the kernel
// reads them for job.p.weight_dtype, zero-padded to x_bf16_stride (a multiple of 64).
void linear_round_x_avx512bf16(const LinearJob& job, std::uint16_t* x_bf16, int64_t t_begin,
                               int64_t t_end);

// The fp32 dot's weight value and scale (exact), shared by the scalar reference and the tests:
// FP8 codes enter the sums as decode(q) * 2^-8, so their scales are multiplied by 256.
constexpr float kFp8SumUnit = 0x1p-8f;

}  // namespace detail

}  // namespace fp8serve::cpu
