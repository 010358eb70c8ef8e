// Stands in for the CUDA paged attention until branch cudaattn (which defines the functions of
// paged_attention_cuda.hpp, a header taken from that branch as it is) is merged: the merge
// deletes this file. Calling it is an error that says so.
#include <stdexcept>

#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"

namespace fp8serve::cuda {

std::size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaLimits& /*limits*/) { return 0; }

void paged_attention_cuda(const PagedAttentionParams& /*params*/, void* /*workspace*/, std::size_t /*workspace_bytes*/,
                          cudaStream_t /*stream*/, const PagedAttentionCudaOptions& /*options*/) {
  throw std::logic_error("paged attention on CUDA is not built yet (branch cudaattn)");
}

void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream) {
  paged_attention_cuda(params, workspace, workspace_bytes, stream, PagedAttentionCudaOptions{});
}

}  // namespace fp8serve::cuda
