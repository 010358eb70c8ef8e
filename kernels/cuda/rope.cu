// RoPE on the GPU (RopeParams, forward_ops.hpp): the rotate_half layout, cos/sin from the table
// of set_rope_table() (fp32, the host's own values; llama3 scaling is already in inv_freq), and
// the host reference's arithmetic (kernels/cpu/ops_rope.cpp): four separately rounded products,
// then one subtraction and one addition - no FMA, so the fp32 result is bitwise the host's and
// the bf16 output is that value rounded once.
//
// Launch: one block of 128 threads per token; a thread rotates kVec pairs (i, i + half) of one
// head: two 16-byte loads of x, four of the table, two 16-byte stores. q and k heads of a token
// share the block, so the token's table row is read from L1 after the first head. With
// RopeParams::rotate_heads the rotation's kernel does RoPE too, in one launch (head_hadamard.cu).
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"

namespace fp8serve::cuda {

namespace {

constexpr int kThreads = 128;

struct RopeArgs {
  std::uint16_t* q;
  std::uint16_t* k;
  const int32_t* positions;
  RopeTableView table;
  int64_t num_tokens;
  int64_t num_q_heads;  // 0 when q is null
  int64_t num_kv_heads;  // 0 when k is null
  int64_t head_dim;
  int64_t q_stride;
  int64_t k_stride;
  unsigned* errors;
};

template <int kVec>
FP8SERVE_DEVICE void load_f32(const float* p, float (&out)[kVec]) {
  if constexpr (kVec == 8) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
FP8SERVE_UNROLL
    for (int i = 0; i < kVec; ++i) out[i] = p[i];
  }
}

template <int kVec>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs a) {
  const int64_t token = blockIdx.x;
  const int32_t pos = a.positions[token];
  if (pos < 0 || pos >= a.table.max_positions) {  // never read outside the table
    if (threadIdx.x == 0) raise_error(a.errors, kErrorPosition);
    return;
  }
  const int64_t half = a.table.half_dim;
  const float* cos_row = a.table.cos + pos * half;
  const float* sin_row = a.table.sin + pos * half;
  const int64_t vecs_per_head = half / kVec;
  const int64_t items = (a.num_q_heads + a.num_kv_heads) * vecs_per_head;
  for (int64_t item = threadIdx.x; item < items; item += blockDim.x) {
    const int64_t head = item / vecs_per_head;
    const int64_t i = (item - head * vecs_per_head) * kVec;
    std::uint16_t* x = head < a.num_q_heads ? a.q + token * a.q_stride + head * a.head_dim
                                            : a.k + token * a.k_stride + (head - a.num_q_heads) * a.head_dim;
    float x0[kVec], x1[kVec], c[kVec], s[kVec];
    load_bf16<kVec>(x + i, x0);
    load_bf16<kVec>(x + i + half, x1);
    load_f32<kVec>(cos_row + i, c);
    load_f32<kVec>(sin_row + i, s);
    float r0[kVec], r1[kVec];
FP8SERVE_UNROLL
    for (int e = 0; e < kVec; ++e) rope_pair(x0[e], x1[e], c[e], s[e], r0[e], r1[e]);
    store_bf16<kVec>(x + i, r0);
    store_bf16<kVec>(x + i + half, r1);
  }
}

}  // namespace

void rope_cuda(const RopeParams& p, const RopeTableView& table, unsigned* errors, cudaStream_t stream) {
  if (table.max_positions < 1) throw std::logic_error("rope: set_rope_table() was not called");
  if (p.num_tokens < 0 || p.head_dim < 1 || p.num_q_heads < 0 || p.num_kv_heads < 0 ||
      2 * table.half_dim > p.head_dim) {
    throw std::invalid_argument("rope (cuda): bad shape or rotary dim larger than head_dim");
  }
  if (p.num_tokens == 0 || (p.q == nullptr && p.k == nullptr)) return;
  if (p.rotate_heads > 0) {  // --kv-rotation: one launch does both (head_hadamard.cu)
    const HadamardRope rope{p.positions, table, p.num_q_heads + (p.k ? p.num_kv_heads : 0), errors};
    return head_hadamard_cuda(rope_rotation(p, sizeof(std::uint16_t)), stream, &rope);
  }
  RopeArgs a{};
  a.q = static_cast<std::uint16_t*>(p.q);
  a.k = static_cast<std::uint16_t*>(p.k);
  a.positions = p.positions;
  a.table = table;
  a.num_tokens = p.num_tokens;
  a.num_q_heads = p.q ? p.num_q_heads : 0;
  a.num_kv_heads = p.k ? p.num_kv_heads : 0;
  a.head_dim = p.head_dim;
  a.q_stride = p.q_token_stride ? p.q_token_stride : p.num_q_heads * p.head_dim;
  a.k_stride = p.k_token_stride ? p.k_token_stride : p.num_kv_heads * p.head_dim;
  a.errors = errors;
  const bool vec = table.half_dim % kVec8 == 0 && (!a.q || vec8_ok(a.q, a.q_stride, a.head_dim)) &&
                   (!a.k || vec8_ok(a.k, a.k_stride, a.head_dim)) && aligned_to(table.cos, 16) &&
                   aligned_to(table.sin, 16);
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  if (vec) {
    FP8SERVE_LAUNCH((rope_kernel<kVec8>), grid, dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  } else {
    FP8SERVE_LAUNCH((rope_kernel<1>), grid, dim3(kThreads), 0, stream, a);
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp8serve::cuda
