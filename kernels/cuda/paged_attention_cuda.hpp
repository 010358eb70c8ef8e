#pragma once
// The CUDA paged attention (decode and prefill over kernels/paged_kv.hpp's pool) as the backend
// calls it. The kernels are written on branch cudaattn; until that branch is merged,
// paged_attention_stub.cu defines these and throws.
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/paged_attention.hpp"

namespace fp8serve::cuda {

// Bytes of device workspace paged_attention_cuda needs for these params (split-K partials and
// the like); 0 if none. The backend keeps one workspace and grows it to the largest request.
std::size_t paged_attention_cuda_workspace_bytes(const PagedAttentionParams& params);

// softmax(q k^T * scale) v for every query token (paged_attention.hpp), on `stream`.
// PRECOND: workspace_bytes >= paged_attention_cuda_workspace_bytes(params).
void paged_attention_cuda(const PagedAttentionParams& params, void* workspace, std::size_t workspace_bytes,
                          cudaStream_t stream);

}  // namespace fp8serve::cuda
