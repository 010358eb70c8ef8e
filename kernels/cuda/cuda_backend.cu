// The CUDA backend: see cuda_backend.hpp.
#include "kernels/cuda/cuda_backend.hpp"

#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cpu/ops.hpp"  // make_rope_table: the host computes the table, the device reads it
#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/linear_checks.hpp"
#include "kernels/cuda/linear_cublaslt.hpp"
#include "kernels/cuda/make_cuda_backend.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"

namespace fp8serve::cuda {

namespace {

// Copies up to this size go through the pinned arena (the step's metadata, the sampled rows'
// logits, the scales); larger ones (weights at load time) are left to the driver.
constexpr std::size_t kMaxStagedCopy = std::size_t{64} << 20;

std::string describe_errors(unsigned bits) {
  std::string what;
  auto add = [&](unsigned bit, const char* text) {
    if (bits & bit) what += (what.empty() ? "" : "; ") + std::string(text);
  };
  add(kErrorTokenId, "a token id outside the vocabulary (its embedding row was zeroed)");
  add(kErrorPosition, "a position outside the RoPE table (left unrotated)");
  add(kErrorRow, "a gathered row outside the tensor (zeroed)");
  add(kErrorSlot, "a KV slot outside the pool (not written)");
  return "cuda backend: the kernels found " + what + " - the step's results are invalid";
}

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  if (device < 0 || device >= device_count()) {
    throw std::runtime_error("cuda backend: no CUDA device " + std::to_string(device) + " (" +
                             std::to_string(device_count()) + " found)");
  }
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&errors_), sizeof(unsigned)));
  CUDA_CHECK(cudaMemsetAsync(errors_, 0, sizeof(unsigned), stream_));
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&errors_host_), sizeof(unsigned)));
  *errors_host_ = 0;
  cublaslt_ = std::make_unique<CublasLtLinear>();
}

CudaBackend::~CudaBackend() {
  // No throwing here: a destructor may run while an exception unwinds.
  if (capturing_ != nullptr) {
    cudaGraph_t lost = nullptr;
    cudaStreamEndCapture(capturing_, &lost);
    if (lost != nullptr) cudaGraphDestroy(lost);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cublaslt_.reset();
  for (void* p : {rope_buffer_, calibration_, copy_scratch_, attention_workspace_, linear_workspace_,
                  linear_tickets_, fp8_gemm_scratch_, sampling_workspace_, static_cast<void*>(errors_)}) {
    if (p != nullptr) cudaFree(p);
  }
  for (void* p : retired_) cudaFree(p);
  if (errors_host_ != nullptr) cudaFreeHost(errors_host_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string CudaBackend::describe() const {
#if FP8SERVE_CUDA_EMU
  return "cuda (emulated on the CPU: " + describe_device(device_) +
         "; projections on the emulator's cuBLASLt stand-in, FP8 weights on the tensor-core GEMV)";
#else  // coverage: the real build's description (the emulated one is tested)
  return "cuda: " + describe_device(device_) + "; projections on cuBLASLt, FP8 weights on the tensor-core GEMV";
#endif
}

void CudaBackend::refuse_in_capture(const char* what) {
  if (capturing_ == nullptr) return;
  cudaGraph_t lost = nullptr;
  cudaStreamEndCapture(capturing_, &lost);
  if (lost != nullptr) cudaGraphDestroy(lost);
  (void)cudaGetLastError();
  capturing_ = nullptr;
  throw std::logic_error(std::string("cuda backend: ") + what + " inside a graph capture (the capture is abandoned)");
}

void CudaBackend::begin_capture(Stream stream) {
  if (capturing_ != nullptr) throw std::logic_error("cuda backend: begin_capture while a capture is open");
  const cudaStream_t s = stream_of(stream);
  // Global mode: any call that could synchronise during the capture fails instead of racing it.
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  capturing_ = s;
}

std::unique_ptr<Backend::Graph> CudaBackend::end_capture(Stream stream) {
  const cudaStream_t s = stream_of(stream);
  if (capturing_ != s) throw std::logic_error("cuda backend: end_capture without begin_capture on that stream");
  capturing_ = nullptr;
  // A failed capture or instantiation also leaves its error as the thread's last error: clear it,
  // or the next CUDA_CHECK(cudaGetLastError()) would blame an unrelated kernel launch.
  cudaGraph_t graph = nullptr;
  if (const cudaError_t err = cudaStreamEndCapture(s, &graph); err != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw_cuda_error(err, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  cudaGraphExec_t exec = nullptr;
  // coverage: a driver that cannot instantiate a captured graph (the emulator always can)
  if (const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0); err != cudaSuccess) {
    (void)cudaGetLastError();
    cudaGraphDestroy(graph);
    throw_cuda_error(err, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  graphs_made_ = true;
  return std::make_unique<CudaGraph>(graph, exec);
}

void CudaBackend::replay(const Graph& graph, Stream stream) {
  refuse_in_capture("replay");
  CUDA_CHECK(cudaGraphLaunch(static_cast<const CudaGraph&>(graph).exec(), stream_of(stream)));
}

void* CudaBackend::allocate(std::size_t bytes) {
  refuse_in_capture("allocate");
  if (bytes == 0) bytes = 1;
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it and report it as the interface says
    throw std::bad_alloc();
  }
  CUDA_CHECK(err);
  // Zeroed on the backend's stream, so every later op on it sees the zeros.
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream_));
  return ptr;
}

void CudaBackend::free(void* ptr) {
  if (ptr == nullptr) return;
  refuse_in_capture("free");
  cudaStreamSynchronize(stream_);  // work still queued may use it; errors surface elsewhere
  cudaFree(ptr);
}

void CudaBackend::drain(cudaStream_t stream) {
  refuse_in_capture("a synchronization");
  if (staging_.used() > 0 && stream != staged_on_)
    throw std::logic_error("cuda backend: the staging arena holds copies queued on another stream; synchronize that "
                           "stream (the backend serves one stream at a time)");
  CUDA_CHECK(cudaStreamSynchronize(stream));
  staging_.finish();
}

void* CudaBackend::stage(std::size_t bytes, cudaStream_t stream) {
  if (staging_.used() > 0 && stream != staged_on_)
    throw std::logic_error("cuda backend: a staged copy on a second stream while the arena holds another's; "
                           "synchronize the first (the backend serves one stream at a time)");
  staged_on_ = stream;
  if (void* p = staging_.take(bytes)) return p;
  const std::size_t step = staging_.used() + bytes + 16;  // what this step stages, so far
  drain(stream);
  staging_.reserve(step);
  void* p = staging_.take(bytes);
  if (p == nullptr) throw std::logic_error("cuda backend: staging arena too small after growing");
  return p;
}

void* CudaBackend::allocate_host(std::size_t bytes) {
  refuse_in_capture("allocate_host");
  void* ptr = nullptr;
  const cudaError_t err = cudaMallocHost(&ptr, bytes ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw std::bad_alloc();
  }
  CUDA_CHECK(err);
  std::memset(ptr, 0, bytes);
  pinned_.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  return ptr;
}

void CudaBackend::free_host(void* ptr) {
  if (ptr == nullptr) return;
  refuse_in_capture("free_host");
  pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  cudaFreeHost(ptr);  // waits for the device, as cudaFree does; errors surface elsewhere
}

bool CudaBackend::pinned(const void* p, std::size_t bytes) const {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return false;
  --it;
  return address + bytes <= it->first + it->second;
}

void CudaBackend::copy_to_device(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  refuse_in_capture("copy_to_device");
  const cudaStream_t s = stream_of(stream);
  if (pinned(src, bytes)) {  // one DMA, read when the stream gets there
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return;
  }
  if (bytes > kMaxStagedCopy) {
    // Pageable source: the call returns once the driver has its own copy of `src`.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    return;
  }
  void* staged = stage(bytes, s);
  std::memcpy(staged, src, bytes);
  CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, s));
}

void CudaBackend::copy_to_host(void* dst, const void* src, std::size_t bytes, Stream stream) {
  if (bytes == 0) return;
  refuse_in_capture("copy_to_host");
  const cudaStream_t s = stream_of(stream);
  if (pinned(dst, bytes)) {  // one DMA straight into the caller's buffer
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return;
  }
  if (bytes > kMaxStagedCopy) {
    // Pageable destination: the call returns once the data is there.
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    return;
  }
  void* staged = stage(bytes, s);
  CUDA_CHECK(cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDeviceToHost, s));
  staging_.defer(dst, staged, bytes);
}

void CudaBackend::synchronize(Stream stream) {
  refuse_in_capture("synchronize");
  const cudaStream_t s = stream_of(stream);
  CUDA_CHECK(cudaMemcpyAsync(errors_host_, errors_, sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  drain(s);
  const unsigned bits = *errors_host_;
  if (bits != 0) {
    *errors_host_ = 0;
    CUDA_CHECK(cudaMemsetAsync(errors_, 0, sizeof(unsigned), s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    throw std::out_of_range(describe_errors(bits));
  }
}

std::optional<DeviceMemory> CudaBackend::memory_info() const {
  DeviceMemory memory;
  CUDA_CHECK(cudaMemGetInfo(&memory.free, &memory.total));
  return memory;
}

void* CudaBackend::scratch(void*& buffer, std::size_t& capacity, std::size_t bytes, cudaStream_t stream) {
  if (bytes <= capacity) return buffer;
  std::size_t grown = capacity ? capacity : 4096;
  while (grown < bytes) grown *= 2;
  void* fresh = allocate(grown);  // zeroed on stream_
  if (stream != stream_) CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (buffer != nullptr) {
    drain(stream);
    // A captured graph may hold the old buffer's address: keep it until the backend goes.
    if (graphs_made_) {
      retired_.push_back(buffer);
    } else {
      cudaFree(buffer);
    }
  }
  buffer = fresh;
  capacity = grown;
  return buffer;
}

void CudaBackend::copy_blocks(const CopyBlocksParams& p, Stream stream) {
  if (p.num_layers < 0 || p.num_copies < 0) throw std::invalid_argument("copy_blocks: negative count");
  if (p.num_layers == 0 || p.num_copies == 0) return;
  std::vector<BlockCopyPool> pools;
  bool aligned16 = true;
  for (int32_t layer = 0; layer < p.num_layers; ++layer) {
    const PagedKvView& view = p.layers[layer];
    // A packed view keeps a block contiguous: block_stride elements from its first one.
    if (view.block_stride != view.head_stride * view.num_kv_heads ||
        view.head_stride != static_cast<int64_t>(view.block_size) * view.v_token_stride) {
      throw std::invalid_argument("copy_blocks: needs a densely packed KV view");
    }
    for (int32_t i = 0; i < p.num_copies; ++i) {
      if (p.src[i] < 0 || p.src[i] >= view.num_blocks || p.dst[i] < 0 || p.dst[i] >= view.num_blocks) {
        throw std::out_of_range("copy_blocks: block id outside the pool");
      }
    }
    const int64_t block_bytes = view.block_stride * static_cast<int64_t>(kv_dtype_size(view.dtype));
    for (void* base : {view.k, view.v}) {
      if (base == nullptr) continue;  // a K-only view
      pools.push_back({static_cast<unsigned char*>(base), block_bytes});
      aligned16 = aligned16 && block_bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(base) % 16 == 0;
    }
  }
  if (pools.size() > 65535) throw std::invalid_argument("copy_blocks: more than 65,535 pools");
  const cudaStream_t s = stream_of(stream);
  const std::size_t pool_bytes = pools.size() * sizeof(BlockCopyPool);
  const std::size_t pair_bytes = static_cast<std::size_t>(p.num_copies) * 2 * sizeof(int32_t);
  std::vector<unsigned char> host(pool_bytes + pair_bytes);
  std::memcpy(host.data(), pools.data(), pool_bytes);
  auto* pairs = reinterpret_cast<int32_t*>(host.data() + pool_bytes);
  for (int32_t i = 0; i < p.num_copies; ++i) {
    pairs[2 * i] = p.src[i];
    pairs[2 * i + 1] = p.dst[i];
  }
  auto* device = static_cast<unsigned char*>(scratch(copy_scratch_, copy_scratch_bytes_, host.size(), s));
  copy_to_device(device, host.data(), host.size(), stream);
  copy_blocks_cuda(reinterpret_cast<const BlockCopyPool*>(device), static_cast<int32_t>(pools.size()),
                   reinterpret_cast<const int32_t*>(device + pool_bytes), p.num_copies, aligned16, s);
}

void CudaBackend::set_rope_table(const std::vector<float>& inv_freq, int64_t max_positions) {
  const cpu::RopeTable table = cpu::make_rope_table(inv_freq, max_positions);
  const std::size_t half_bytes = table.cos.size() * sizeof(float);
  // Released first: a model is loaded once, and the old table must not outlive the new one's
  // allocation on a nearly full device.
  if (rope_buffer_ != nullptr) {
    drain(stream_);
    cudaFree(rope_buffer_);
    rope_buffer_ = nullptr;
    rope_ = RopeTableView{};
  }
  rope_buffer_ = allocate(2 * half_bytes);
  rope_bytes_ = 2 * half_bytes;
  auto* base = static_cast<float*>(rope_buffer_);
  copy_to_device(base, table.cos.data(), half_bytes, Stream{});
  copy_to_device(base + table.cos.size(), table.sin.data(), half_bytes, Stream{});
  synchronize(Stream{});  // the host table goes away on return
  rope_.cos = base;
  rope_.sin = base + table.cos.size();
  rope_.half_dim = table.half_dim;
  rope_.max_positions = table.max_positions;
}

void CudaBackend::embedding(const EmbeddingParams& p, Stream stream) { embedding_cuda(p, errors_, stream_of(stream)); }

void CudaBackend::rms_norm(const RmsNormParams& p, Stream stream) { rms_norm_cuda(p, stream_of(stream)); }

void CudaBackend::linear(const LinearParams& p, Stream stream) {
  // FP8 weights: up to 16 tokens (decode) weight-only on tensor cores, split-K
  // (linear_fp8_gemv.cu); more on cuBLASLt's FP8 GEMM with the activations quantized per token
  // (or per token and 128-input block) where the device has sm_90's FP8 GEMM and it takes the shape
  // and the scales, else (sm_80, sm_89, Blackwell; other shapes) the GEMV in groups of 16 tokens. The workspaces grow to the largest projection seen (before
  // any graph capture: the transformer runs a step op by op before capturing it).
  if (p.weight_dtype == WeightDtype::fp8_e4m3) {
    const cudaStream_t s = stream_of(stream);
    if (p.num_tokens > kFp8GemvMaxTokens && cublaslt_->fp8_gemm_available() && CublasLtLinear::fp8_gemm_supported(p)) {
      linear_fp8_gemm(p, s);
      return;
    }
    const std::size_t bytes = linear_fp8_gemv_workspace_bytes(p.num_tokens, p.in_features, p.out_features, p.weight_block_k);
    void* workspace = bytes ? scratch(linear_workspace_, linear_workspace_bytes_, bytes, s) : nullptr;
    // Tickets: zeroed when the buffer grows, left zero by every launch.
    const int64_t tickets = linear_fp8_gemv_tickets(p.out_features);
    auto* counters = static_cast<unsigned*>(
        scratch(linear_tickets_, linear_tickets_bytes_, static_cast<std::size_t>(tickets) * sizeof(unsigned), s));
    linear_fp8_gemv_cuda(p, workspace, linear_workspace_bytes_, counters,
                         static_cast<int64_t>(linear_tickets_bytes_ / sizeof(unsigned)), s);
  } else {
    cublaslt_->run(p, stream_of(stream));
  }
}

void CudaBackend::linear_fp8_gemm(const LinearParams& p, cudaStream_t s) {
  check_linear_params(p, "linear (cuda, FP8 GEMM)");
  // One scratch buffer: x's codes [T, K], x's scales, and (128-blocks) W's scales in VEC128's
  // layout, each 256-byte aligned.
  const bool block128 = p.weight_block_k > 0 && p.weight_block_k < p.in_features;
  const int64_t k_blocks = (p.in_features + 127) / 128;
  const auto pad4 = [](int64_t v) { return (v + 3) / 4 * 4; };
  const auto round256 = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t codes_bytes = round256(p.num_tokens * p.in_features);
  const int64_t x_scale_bytes = round256(4 * (block128 ? k_blocks * pad4(p.num_tokens) : p.num_tokens));
  const int64_t w_scale_bytes = block128 ? round256(4 * k_blocks * pad4(p.out_features)) : 0;
  auto* base = static_cast<unsigned char*>(scratch(fp8_gemm_scratch_, fp8_gemm_scratch_bytes_,
                                                   static_cast<std::size_t>(codes_bytes + x_scale_bytes + w_scale_bytes), s));
  Fp8GemmOperands q;
  q.x_codes = base;
  q.x_ld = p.in_features;
  q.x_scales = reinterpret_cast<float*>(base + codes_bytes);
  q.block128 = block128;
  fp8_quantize_act_cuda(static_cast<const std::uint16_t*>(p.x), p.x_stride ? p.x_stride : p.in_features, p.num_tokens,
                        p.in_features, block128, base, q.x_ld, reinterpret_cast<float*>(base + codes_bytes),
                        pad4(p.num_tokens), s);
  if (block128) {
    auto* w_scales = reinterpret_cast<float*>(base + codes_bytes + x_scale_bytes);
    fp8_scales_by_block_cuda(p.weight_scales, p.out_features, k_blocks, w_scales, pad4(p.out_features), s);
    q.w_scales = w_scales;
  } else {
    q.w_scales = p.weight_scales;
  }
  cublaslt_->run_fp8(p, q, s);
}

void CudaBackend::rope(const RopeParams& p, Stream stream) { rope_cuda(p, rope_, errors_, stream_of(stream)); }

void CudaBackend::kv_spill(const KvSpillParams& p, Stream stream) { kv_spill_cuda(p, errors_, stream_of(stream)); }

void CudaBackend::kv_write(const KvWriteParams& p, Stream stream) {
  const cudaStream_t s = stream_of(stream);
  KvCalibrationSlot* slots = nullptr;
  if (p.cache.dtype == KvDtype::fp8_e4m3 && p.batch.calibrate != nullptr && p.batch.num_seqs > 0) {
    const std::size_t bytes = static_cast<std::size_t>(p.batch.num_seqs) * sizeof(KvCalibrationSlot);
    slots = static_cast<KvCalibrationSlot*>(scratch(calibration_, calibration_bytes_, bytes, s));
  }
  kv_write_cuda(p, slots, errors_, s);
}

void CudaBackend::reserve_attention_workspace(int32_t max_num_seqs, int32_t num_heads, int32_t num_kv_heads,
                                              int32_t head_dim, int32_t max_context) {
  PagedAttentionCudaLimits limits;
  limits.max_num_seqs = max_num_seqs;
  limits.num_heads = num_heads;
  limits.num_kv_heads = num_kv_heads;
  limits.head_dim = head_dim;
  limits.max_context = max_context;
  const std::size_t bytes = paged_attention_cuda_workspace_bytes(limits);
  if (bytes) scratch(attention_workspace_, attention_workspace_bytes_, bytes, stream_);
}

void CudaBackend::paged_attention(const PagedAttentionParams& p, Stream stream) {
  const cudaStream_t s = stream_of(stream);
  // Sized for this step's batch and grown to the largest one seen, so the steady state never
  // allocates (a CUDA graph captured later sees one fixed workspace).
  PagedAttentionCudaLimits limits;
  limits.max_num_seqs = p.batch.num_seqs;
  limits.num_heads = p.num_heads;
  limits.num_kv_heads = p.cache.num_kv_heads;
  limits.head_dim = p.cache.head_dim;
  limits.max_context = p.batch.max_blocks_per_seq * p.cache.block_size;
  const std::size_t bytes = paged_attention_cuda_workspace_bytes(limits);
  void* workspace = bytes ? scratch(attention_workspace_, attention_workspace_bytes_, bytes, s) : nullptr;
  paged_attention_cuda(p, workspace, attention_workspace_bytes_, s);
}

void CudaBackend::head_hadamard(const HeadHadamardParams& p, Stream stream) {
  head_hadamard_cuda(p, stream_of(stream));
}
void CudaBackend::silu_mul(const SiluMulParams& p, Stream stream) { silu_mul_cuda(p, stream_of(stream)); }

void CudaBackend::residual_add(const ResidualAddParams& p, Stream stream) {
  residual_add_cuda(p, stream_of(stream));
}

void CudaBackend::gather_rows(const GatherRowsParams& p, Stream stream) {
  gather_rows_cuda(p, errors_, stream_of(stream));
}

void CudaBackend::sample_greedy(const GreedySampleParams& p, Stream stream) {
  const cudaStream_t s = stream_of(stream);
  const std::size_t bytes = sampling_workspace_bytes(p.num_rows, p.vocab_size, p.slices);
  void* workspace = bytes ? scratch(sampling_workspace_, sampling_workspace_bytes_, bytes, s) : nullptr;
  sample_greedy_cuda(p, workspace, sampling_workspace_bytes_, s);
}

void CudaBackend::sample_candidates(const CandidateSampleParams& p, Stream stream) {
  const cudaStream_t s = stream_of(stream);
  const std::size_t bytes = sampling_workspace_bytes(p.num_rows, p.vocab_size, p.slices);
  void* workspace = bytes ? scratch(sampling_workspace_, sampling_workspace_bytes_, bytes, s) : nullptr;
  sample_candidates_cuda(p, workspace, sampling_workspace_bytes_, s);
}

void CudaBackend::process_logits(const LogitProcessParams& p, Stream stream) {
  process_logits_cuda(p, stream_of(stream));
}

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

}  // namespace fp8serve::cuda
