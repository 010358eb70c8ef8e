// Row gathers on the GPU: the embedding lookup (out[t] = table[token_ids[t]]) and gather_rows
// (out[i] = x[rows[i]], the rows that sample). On the GPU both are bf16 row copies - the
// activations are bf16 like the table - so one kernel serves both.
//
// An index outside [0, num_src_rows) is never followed: its output row is zeroed and the
// kernel raises the op's DeviceError bit, which CudaBackend::synchronize() reports (the host
// Transformer validates ids before uploading them, so this is the backstop).
//
// Launch: one block per output row (grid-stride past 2^31 - 1), 128 threads copying 16-byte
// vectors when the rows allow it.
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 128;

struct GatherArgs {
  const std::uint16_t* src;  // [num_src_rows, dim]
  const int32_t* index;      // [num_rows]
  std::uint16_t* out;        // [num_rows, dim]
  int64_t num_src_rows;
  int64_t num_rows;
  int64_t dim;
  unsigned* errors;
  unsigned error_bit;
};

template <int kVec>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const GatherArgs a) {
  const int64_t num_vecs = a.dim / kVec;
  for (int64_t r = blockIdx.x; r < a.num_rows; r += gridDim.x) {
    const int32_t index = a.index[r];
    std::uint16_t* out = a.out + r * a.dim;
    if (index < 0 || index >= a.num_src_rows) {
      if (threadIdx.x == 0) raise_error(a.errors, a.error_bit);
      for (int64_t j = threadIdx.x; j < a.dim; j += blockDim.x) out[j] = 0;
      continue;
    }
    const std::uint16_t* src = a.src + static_cast<int64_t>(index) * a.dim;
    for (int64_t j = threadIdx.x; j < num_vecs; j += blockDim.x) copy_bf16<kVec>(out + j * kVec, src + j * kVec);
  }
}

void gather(GatherArgs a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.dim == 0) return;
  const unsigned blocks = static_cast<unsigned>(a.num_rows < (1u << 30) ? a.num_rows : (1u << 30));
  if (vec8_ok(a.src, a.dim, a.dim) && vec8_ok(a.out, a.dim, a.dim)) {
    FP8SERVE_LAUNCH((gather_rows_kernel<kVec8>), dim3(blocks), dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  } else {
    FP8SERVE_LAUNCH((gather_rows_kernel<1>), dim3(blocks), dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace

void embedding_cuda(const EmbeddingParams& p, unsigned* errors, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.vocab_size < 1 || p.hidden < 1) throw std::invalid_argument("embedding (cuda): bad shape");
  GatherArgs a{p.table, p.token_ids, static_cast<std::uint16_t*>(p.out), p.vocab_size, p.num_tokens, p.hidden,
               errors, kErrorTokenId};
  gather(a, stream);
}

void gather_rows_cuda(const GatherRowsParams& p, unsigned* errors, cudaStream_t stream) {
  if (p.num_rows < 0 || p.dim < 0 || p.num_x_rows < 0) throw std::invalid_argument("gather_rows (cuda): bad shape");
  GatherArgs a{static_cast<const std::uint16_t*>(p.x), p.rows, static_cast<std::uint16_t*>(p.out), p.num_x_rows,
               p.num_rows, p.dim, errors, kErrorRow};
  gather(a, stream);
}

}  // namespace fp8serve::cuda
