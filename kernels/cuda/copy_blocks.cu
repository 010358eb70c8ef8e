// Copy-on-write of paged KV blocks on the GPU: every (src, dst) pair in every K and V pool of
// every layer, in one launch. The backend uploads the pools' base pointers and the pairs (host
// arrays in CopyBlocksParams, validated there) and calls this once.
//
// Launch: grid (pairs, pools), 256 threads copying 16-byte vectors (a block of an FP8 pool is
// block_size * kv_heads * head_dim bytes, 16 KiB for Llama-3-8B with 16-token blocks).
#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads) copy_blocks_kernel(const BlockCopyPool* pools, const int32_t* pairs) {
  const BlockCopyPool pool = pools[blockIdx.y];
  const int32_t src = pairs[2 * blockIdx.x];
  const int32_t dst = pairs[2 * blockIdx.x + 1];
  const int64_t n = pool.block_bytes / static_cast<int64_t>(sizeof(T));
  const T* from = reinterpret_cast<const T*>(pool.base + src * pool.block_bytes);
  T* to = reinterpret_cast<T*>(pool.base + dst * pool.block_bytes);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
}

}  // namespace

void copy_blocks_cuda(const BlockCopyPool* pools, int32_t num_pools, const int32_t* pairs, int32_t num_copies,
                      bool aligned16, cudaStream_t stream) {
  if (num_pools < 1 || num_copies < 1) return;
  const dim3 grid(static_cast<unsigned>(num_copies), static_cast<unsigned>(num_pools));
  if (aligned16) {
    FP8SERVE_LAUNCH((copy_blocks_kernel<uint4>), grid, dim3(kThreads), 0, stream, pools, pairs);
    CUDA_CHECK(cudaGetLastError());
  } else {
    FP8SERVE_LAUNCH((copy_blocks_kernel<unsigned char>), grid, dim3(kThreads), 0, stream, pools, pairs);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp8serve::cuda
