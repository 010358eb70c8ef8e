#pragma once
// The CUDA implementation of the kernel interface (kernels/backend.hpp): bf16 activations,
// cudaMalloc'd device memory, every op a kernel of kernels/cuda/ on one non-blocking stream.
// Projections with bf16 weights run on cuBLASLt (linear_cublaslt.hpp), those with FP8 weights on
// the tensor-core GEMV (linear_fp8_gemv.cu). The emulated build (FP8SERVE_CUDA_EMU) is the same
// class: its cuBLASLt is the emulator's stand-in, so the whole forward pass, linear_cublaslt.cpp
// included, executes on the CPU in CI. Server code creates it through make_cuda_backend.hpp,
// which needs no CUDA headers.
//
// Host <-> device copies from pageable memory go through a pinned staging arena
// (host_staging.hpp) and are asynchronous on the stream; downloads land at synchronize().
// Device data that a kernel finds wrong (DeviceError in ops_cuda.hpp) is reported there too.
// One stream at a time: the staging arena and the error word are shared by the backend's ops. A
// copy staged on one stream while the arena holds another stream's, or a synchronize() of a stream
// other than the one whose copies it holds, is a std::logic_error (the arena would be emptied under
// copies still in flight).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cuda/host_staging.hpp"
#include "kernels/cuda/ops_cuda.hpp"

namespace fp8serve::cuda {

class CublasLtLinear;

class CudaBackend final : public Backend {
 public:
  using Stream = ::fp8serve::Stream;  // not cuda::Stream (device_runtime.hpp's owning wrapper)

  // Makes `device` current for the calling thread and creates the stream, the cuBLASLt handle
  // and its workspace. Throws std::runtime_error when the device is unusable.
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  ActDtype activation_dtype() const override { return ActDtype::bf16; }
  std::string describe() const override;

  void* allocate(std::size_t bytes) override;
  void free(void* ptr) override;
  void copy_to_device(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  void* allocate_host(std::size_t bytes) override;  // pinned (cudaMallocHost)
  void free_host(void* ptr) override;
  void synchronize(Stream stream) override;
  std::optional<DeviceMemory> memory_info() const override;
  void copy_blocks(const CopyBlocksParams& params, Stream stream) override;
  void reserve_attention_workspace(int32_t max_num_seqs, int32_t num_heads, int32_t num_kv_heads,
                                   int32_t head_dim, int32_t max_context) override;
  bool supports_graphs() const override { return true; }
  // Up to kFp8GemvMaxTokens tokens FP8 weights run the GEMV, whose rows do not depend on the
  // batch (linear_fp8_gemv.cu); more run cuBLASLt's FP8 GEMM on quantized activations. The
  // attention is invariant at any size (paged_attention_cuda.hpp). bf16 weights run cuBLASLt at
  // any size: invariant in the emulator's stand-in; on a GPU an algorithm chosen per token count
  // may sum in another order (docs/speculative-decoding.md says what is unverified).
  int64_t batch_invariant_tokens() const override { return kFp8GemvMaxTokens; }
  bool supports_weight_dtype(WeightDtype) const override { return true; }
  void begin_capture(Stream stream) override;
  std::unique_ptr<Graph> end_capture(Stream stream) override;
  void replay(const Graph& graph, Stream stream) override;
  void set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) override;

  void embedding(const EmbeddingParams& params, Stream stream) override;
  void rms_norm(const RmsNormParams& params, Stream stream) override;
  void linear(const LinearParams& params, Stream stream) override;
  void rope(const RopeParams& params, Stream stream) override;
  void head_hadamard(const HeadHadamardParams& params, Stream stream) override;
  void kv_spill(const KvSpillParams& params, Stream stream) override;
  void kv_write(const KvWriteParams& params, Stream stream) override;
  void paged_attention(const PagedAttentionParams& params, Stream stream) override;
  void silu_mul(const SiluMulParams& params, Stream stream) override;
  void residual_add(const ResidualAddParams& params, Stream stream) override;
  void gather_rows(const GatherRowsParams& params, Stream stream) override;
  bool supports_device_sampling() const override { return true; }
  void sample_greedy(const GreedySampleParams& params, Stream stream) override;
  void sample_candidates(const CandidateSampleParams& params, Stream stream) override;
  void process_logits(const LogitProcessParams& params, Stream stream) override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_of(Stream stream) const {
    return stream.handle ? static_cast<cudaStream_t>(stream.handle) : stream_;
  }
  // `bytes` of staging, after draining the stream and growing the arena if it is full: to what
  // this step has staged so far plus `bytes`, so that a step's copies fit next time.
  void* stage(std::size_t bytes, cudaStream_t stream);
  // Whether [p, p + bytes) lies in one allocate_host() buffer: copied directly, not staged.
  bool pinned(const void* p, std::size_t bytes) const;
  // Throws std::logic_error naming `what` when a graph is being captured (ending the capture,
  // which is lost): copies, allocations and synchronization cannot be part of a graph here.
  void refuse_in_capture(const char* what);
  // Waits for the stream and completes the staged downloads (no error check).
  void drain(cudaStream_t stream);
  // A device scratch buffer of at least `bytes` (zeroed when it grows); the stream is drained
  // before an old one is freed.
  void* scratch(void*& buffer, std::size_t& capacity, std::size_t bytes, cudaStream_t stream);
  // FP8 weights, more than 16 tokens, a shape cuBLASLt's FP8 GEMM takes: quantize x, run it.
  void linear_fp8_gemm(const LinearParams& p, cudaStream_t stream);

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaStream_t capturing_ = nullptr;  // the stream being captured, if any
  bool graphs_made_ = false;          // then scratch buffers that grow keep their old memory:
  std::vector<void*> retired_;        // a graph may still launch with it
  HostStaging staging_;
  cudaStream_t staged_on_ = nullptr;  // the stream whose copies the arena holds (while used() > 0)
  std::map<std::uintptr_t, std::size_t> pinned_;  // allocate_host() buffers: start -> bytes
  unsigned* errors_ = nullptr;       // device: DeviceError bits raised by kernels
  unsigned* errors_host_ = nullptr;  // pinned: where synchronize() reads them
  void* rope_buffer_ = nullptr;      // cos then sin, [max_positions, half_dim] each
  std::size_t rope_bytes_ = 0;
  RopeTableView rope_;
  void* calibration_ = nullptr;      // KvCalibrationSlot[], zeroed
  std::size_t calibration_bytes_ = 0;
  void* copy_scratch_ = nullptr;     // copy_blocks' pools and pairs
  std::size_t copy_scratch_bytes_ = 0;
  void* attention_workspace_ = nullptr;
  std::size_t attention_workspace_bytes_ = 0;
  void* linear_workspace_ = nullptr;  // the FP8 GEMV's partial sums
  std::size_t linear_workspace_bytes_ = 0;
  void* linear_tickets_ = nullptr;    // its per-row-block counters: zero between launches
  std::size_t linear_tickets_bytes_ = 0;
  void* sampling_workspace_ = nullptr;  // the sampling kernels' per-slice partials
  std::size_t sampling_workspace_bytes_ = 0;
  void* fp8_gemm_scratch_ = nullptr;  // the FP8 GEMM's quantized activations and scales
  std::size_t fp8_gemm_scratch_bytes_ = 0;
  std::unique_ptr<CublasLtLinear> cublaslt_;  // bf16-weight projections
};

}  // namespace fp8serve::cuda
