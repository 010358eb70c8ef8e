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
// Greedy sampling (kernels/sampling_ops.hpp): each row's argmax and its softmax denominator.
void sample_greedy_cuda(const GreedySampleParams& params, cudaStream_t stream);
// The top-k prefilter (kernels/sampling_ops.hpp): each row's best K candidates and its two ExpSums.
void sample_candidates_cuda(const CandidateSampleParams& params, cudaStream_t stream);
// The host sampler's logit processing (kernels/sampling_ops.hpp, LogitEdit), in place.
void process_logits_cuda(const LogitProcessParams& params, cudaStream_t stream);

// aligned16: every base and block_bytes a multiple of 16 (16-byte copies).
void copy_blocks_cuda(const BlockCopyPool* pools, int32_t num_pools, const int32_t* pairs,
                      int32_t num_copies, bool aligned16, cudaStream_t stream);

// The portable tiled GEMM (linear_portable.cu): the emulated backend's linear, and the reference
// the cuBLASLt path is tested against on a GPU.
void linear_portable_cuda(const LinearParams& params, cudaStream_t stream);

}  // namespace fp8serve::cuda
