#pragma once
// The CUDA backend's kernels, one host launcher per op (kernels/cuda/*.cu). Each takes the op's
// params struct (kernels/forward_ops.hpp, kv_write.hpp) holding device pointers - activations
// bf16 (__nv_bfloat16), weights bf16 bits - checks the shapes on the host, picks the launch
// configuration and launches on the stream. None of them synchronizes.
//
// Device data that may be wrong (token ids, positions, gathered rows, slots) is checked by the
// kernels themselves: an out-of-range value is never dereferenced; the kernel skips it (writing
// zeros where an output row would be left undefined) and raises a DeviceError bit in `errors`
// (one device word), which CudaBackend::synchronize() turns into an exception. The host-side
// Transformer validates the same values before they are uploaded, so the flags are a backstop.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/forward_ops.hpp"
#include "kernels/kv_spill.hpp"
#include "kernels/kv_write.hpp"
#include "kernels/sampling_ops.hpp"

namespace fp8serve::cuda {

enum DeviceError : unsigned {
  kErrorTokenId = 1u,   // embedding: token id outside [0, vocab_size)
  kErrorPosition = 2u,  // rope: position outside the table
  kErrorRow = 4u,       // gather_rows: row outside [0, num_x_rows)
  kErrorSlot = 8u,      // kv_write: slot (or tail slot) outside the pool
};

// The RoPE table of set_rope_table() on the device: [max_positions, half_dim] fp32 each.
struct RopeTableView {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t half_dim = 0;
  int64_t max_positions = 0;
};

// Per-sequence scratch of kv_write's calibration pass: the running K and V amax (as the bits of
// a non-negative float, so an integer atomicMax orders them) and a count of finished blocks. All
// zero between launches: the last block of each sequence resets its slot.
struct KvCalibrationSlot {
  unsigned k_amax_bits;
  unsigned v_amax_bits;
  unsigned blocks_done;
};

// One K or V pool of one layer for copy_blocks: block b occupies bytes
// [b * block_bytes, (b + 1) * block_bytes) of base.
struct BlockCopyPool {
  unsigned char* base;
  int64_t block_bytes;
};

void embedding_cuda(const EmbeddingParams& params, unsigned* errors, cudaStream_t stream);
void gather_rows_cuda(const GatherRowsParams& params, unsigned* errors, cudaStream_t stream);
void rms_norm_cuda(const RmsNormParams& params, cudaStream_t stream);
void rope_cuda(const RopeParams& params, const RopeTableView& table, unsigned* errors, cudaStream_t stream);
void silu_mul_cuda(const SiluMulParams& params, cudaStream_t stream);
// RoPE fused into head_hadamard_cuda (RopeParams::rotate_heads): the first `heads` heads of the
// rotation's span are q and k, turned first and rounded to bf16 as rope_cuda stores them.
struct HadamardRope {
  const int32_t* positions;
  RopeTableView table;
  int64_t heads;
  unsigned* errors;
};
void head_hadamard_cuda(const HeadHadamardParams& params, cudaStream_t stream, const HadamardRope* rope = nullptr);
void residual_add_cuda(const ResidualAddParams& params, cudaStream_t stream);
// y[t, o] += bias[o] on fp32 rows (the one bias cuBLASLt's epilogue does not take: fp32 output).
void add_bias_f32_cuda(float* y, int64_t y_stride, const std::uint16_t* bias, int64_t num_rows,
                       int64_t num_cols, cudaStream_t stream);

// calibration: >= batch.num_seqs zeroed slots (device), used only when batch.calibrate != null.
void kv_write_cuda(const KvWriteParams& params, KvCalibrationSlot* calibration, unsigned* errors,
                   cudaStream_t stream);

// pools: [num_pools] device array; pairs: [num_copies, 2] device array of (src, dst) block ids,
// validated by the caller. Copies every pair in every pool.
// The bf16 window's spill (kernels/kv_spill.hpp); a block id outside the pool raises kErrorSlot.
void kv_spill_cuda(const KvSpillParams& params, unsigned* errors, cudaStream_t stream);
// Greedy sampling (kernels/sampling_ops.hpp): each row's argmax and its softmax denominator. A row is
// cut into slices (params.slices, 0: chosen from the shape), whose partials live in the workspace:
// at least sampling_workspace_bytes(rows, vocab, slices) bytes, device.
std::size_t sampling_workspace_bytes(int64_t num_rows, int64_t vocab_size, int32_t slices);
void sample_greedy_cuda(const GreedySampleParams& params, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);
// The top-k prefilter (kernels/sampling_ops.hpp): each row's best K candidates and its two ExpSums;
// the workspace as sample_greedy_cuda's.
void sample_candidates_cuda(const CandidateSampleParams& params, void* workspace, std::size_t workspace_bytes,
                            cudaStream_t stream);
// The host sampler's logit processing (kernels/sampling_ops.hpp, LogitEdit), in place.
void process_logits_cuda(const LogitProcessParams& params, cudaStream_t stream);

// aligned16: every base and block_bytes a multiple of 16 (16-byte copies).
void copy_blocks_cuda(const BlockCopyPool* pools, int32_t num_pools, const int32_t* pairs,
                      int32_t num_copies, bool aligned16, cudaStream_t stream);

// FP8-weight projections on tensor cores (linear_fp8_gemv.cu): weight-only, split-K, for decode
// steps (up to kFp8GemvMaxTokens tokens per launch pair; more run in groups of that many).
constexpr int64_t kFp8GemvMaxTokens = 16;
struct Fp8GemvPlan {
  int64_t slice = 0;   // inputs per split
  int64_t splits = 0;  // k slices: CTAs along k, partial sums per token and row
};
// A function of the shape alone (never of the token count or the device): results are the same
// bits for every batch.
Fp8GemvPlan plan_linear_fp8_gemv(int64_t in_features, int64_t out_features, int64_t weight_block_k);
// The workspace the partial sums need: splits * min(num_tokens, 16) * out_features floats.
std::size_t linear_fp8_gemv_workspace_bytes(int64_t num_tokens, int64_t in_features, int64_t out_features,
                                            int64_t weight_block_k);
// The tickets it needs: one per 128 output rows.
int64_t linear_fp8_gemv_tickets(int64_t out_features);
// params.weight_dtype must be fp8_e4m3; workspace: device memory of at least
// linear_fp8_gemv_workspace_bytes (reused in stream order); tickets: at least
// linear_fp8_gemv_tickets counters, zero, left zero (device memory kept between calls). Throws
// std::invalid_argument for a bad shape, bf16 weights, or a small workspace or ticket array.
void linear_fp8_gemv_cuda(const LinearParams& params, void* workspace, std::size_t workspace_bytes, unsigned* tickets,
                          int64_t num_tickets, cudaStream_t stream);

// The FP8 GEMM's activations (fp8_quantize_act.cu): x [num_tokens, k] bf16 -> codes
// [num_tokens, codes_stride] E4M3 and fp32 scales, scale = max(amax / 448, FLT_MIN) per token
// (scales[t]; k <= 16384) or per token and 128-input block (per_block: scales[kb * scales_stride
// + t], cuBLASLt's VEC128_32F layout with scales_stride >= num_tokens).
void fp8_quantize_act_cuda(const std::uint16_t* x, int64_t x_stride, int64_t num_tokens, int64_t k, bool per_block,
                           std::uint8_t* codes, int64_t codes_stride, float* scales, int64_t scales_stride,
                           cudaStream_t stream);
// out[kb * out_stride + o] = scales[o * k_blocks + kb]: per-row block scales in VEC128_32F's layout.
void fp8_scales_by_block_cuda(const float* scales, int64_t rows, int64_t k_blocks, float* out, int64_t out_stride,
                              cudaStream_t stream);

}  // namespace fp8serve::cuda
