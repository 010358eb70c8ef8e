// FP8 weights for decode-sized steps: y = x @ W^T (+ bias) with at most 16 tokens per launch,
// weight-only on tensor cores (mma.sync m16n8k16, f16 inputs, fp32 accumulators), split-K over
// the whole GPU with a deterministic reduction by the last CTA. LinearParams (forward_ops.hpp) says
// what the op must honour; linear_fp8_gemv_cuda (ops_cuda.hpp) runs it in groups of 16 tokens.
//
// Operands. W [n][k] E4M3 row-major is the mma's A operand (16 output rows x 16 k), x^T its B
// (16 k x 8 tokens): with W as A one mma covers 256 weight bytes (twice what W as B would), and
// 1..8 tokens take one mma per step, 9..16 two. Fragments (ptx.cuh), g = lane / 4, t = lane % 4:
//   a[0] = W[g][2t..2t+1]  a[1] = W[g+8][2t..2t+1]  a[2] = W[g][2t+8..]  a[3] = W[g+8][2t+8..]
//   b[0] = x[token g][2t..2t+1]  b[1] = x[token g][2t+8..2t+9]
// The order of k inside a dot product is free, so k is permuted: lane (g, t) loads 16
// consecutive bytes of row g (and of row g + 8), k0 + 16t .. 16t + 15, and feeds 4 mma steps
// from them: step s takes the 32-bit word s, its low E4M3 pair as the logical k {2t, 2t+1}, its
// high pair as {2t+8, 2t+9}; each pair becomes an f16 pair with one cvt.rn.f16x2.e4m3x2 (exact).
// x then needs the same permutation, which is the identity: step s of lane (g, t) wants
// x[token g][k0 + 16t + 4s .. + 3], so the lane's B fragments for the 4 steps are 32 consecutive
// bytes of x's f16 row in shared memory (two 16-byte loads).
//
// x in f16: x is bf16, whose range f16 lacks. Each CTA scales each token row of its k slice by a
// power of two that puts the slice's largest |x| in [2^15, 2^16) (exact; bf16's 8-bit
// significand fits f16's 11 bits, so only elements more than 2^29 below that maximum, which
// become f16 subnormals, round), and multiplies the slice's partial sums back by its inverse
// (exact barring fp32 underflow). The shift depends on that token's row alone.
//
// Scales. One scale per row: the mma accumulates the whole slice and the reduction multiplies by
// the row's scale. Block scales (weight_block_k): each block's sum accumulates in its own
// registers and is multiplied by its row's block scale before being added (FFMA), when the block
// ends or the slice does (slices start on block boundaries when blocks are <= 1024 inputs).
//
// Split-K. A CTA of 8 warps owns 128 rows x one k slice (<= 1024 inputs) and writes fp32
// partial sums [split][token][row]; the last CTA of the 128 rows to finish (a threadfence and a
// ticket per row block, which it resets) adds the splits in split order, applies the per-row
// scale and the bias, and writes y: no second launch, whose start and drain would be a sizable
// part of a batch-1 projection (a 4096 x 4096 one streams in ~3.5 us at 4.8 TB/s). No fp32
// atomics: the result is deterministic and batch invariant (y[t] sums the same products in the
// same order whatever the other rows and whichever CTA is last; the mma computes each column of D
// alone). The split count depends on the shape only (never on the token count or the device):
// plan_linear_fp8_gemv weighs whole rounds of kSlots CTAs (2 per SM, which __launch_bounds__
// holds ptxas to, on 132 SMs) against each CTA's fixed cost, so that a small projection runs in one
// round of CTAs a few k steps long, not in two rounds and a tail of one-step CTAs.
//
// A CTA's path: its first step's W loads (8 x 16 bytes a lane, 4 KiB a warp) are issued before x is
// staged, so the DRAM round trip and the staging overlap; then each lane keeps the next step's
// loads in flight while it converts and multiplies the previous ones (a register double buffer).
// The 4 mma steps of a 64-input chunk alternate between two accumulators (even and odd 16-input
// steps), so the tensor core's latency is paid on two independent chains; the two are added once,
// at the end of the slice (or of a scale block): a fixed order, the same for every row and token.
#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/linear_checks.hpp"

namespace fp8serve::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 256;  // a literal: tests/scripts/kernel_resources.py reads it
static_assert(kThreads == kWarps * kWarpSize);
constexpr int kRowsPerWarp = 16;                      // the mma's M
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;  // 128
constexpr int kChunk = 64;                            // k of one 16-byte load per lane: 4 lanes a row
constexpr int kChunksPerStep = 4;                     // loads a lane has in flight per row
constexpr int kStep = kChunk * kChunksPerStep;        // 256
constexpr int kMaxSlice = 1024;                       // k per split: x's stage, 16 x 2 KiB
constexpr int kXPad = 8;  // f16: a stage row is 2064 bytes, 16 mod 128: the B loads are conflict-free
constexpr int kStageVecs = (kMaxSlice + kXPad) / 8;  // a stage row in 16-byte vectors (aligned loads)
// Occupancy: <= 128 registers (__launch_bounds__) x 256 threads: 2 CTAs per SM; the plan's round
// is kSlots CTAs, an H100's or H200's SMs (a constant: the plan never depends on the device).
constexpr int kCtasPerSm = 2;
constexpr int kSlots = kCtasPerSm * 132;
// A CTA's fixed cost (staging x, the first DRAM round trip, the fence and the ticket) in 64-input
// chunks of streaming: about two k steps (a stated estimate, tests/scripts/kernel_model.py's).
constexpr int kFixedChunks = 8;

struct GemvArgs {
  const std::uint16_t* x;  // bf16 [m, x_stride]
  const std::uint8_t* w;   // E4M3 [n, k]
  const float* scales;     // [n, k_blocks]
  float* partial;          // [splits, m, n]
  unsigned* tickets;       // [row blocks], zero between launches
  const float* row_scales;  // [n]: one scale per row (else nullptr: block scales, applied per block)
  const std::uint16_t* bias;  // [n] or nullptr
  void* y;                 // [m, y_stride] bf16 or fp32
  int64_t y_stride;
  bool y_fp32;
  bool x_vec16;  // x's rows start 16-byte aligned and k % 8 == 0: stage_x loads 8 elements at a time
  int64_t x_stride;
  int64_t k_blocks;
  int64_t block_k;  // inputs per scale (k for one scale per row)
  int64_t m, n, k;
  int64_t slice;  // inputs per split, a multiple of 64 (and of block_k when block_k <= kMaxSlice)
};

// 16 codes of one row from k on; kMasked: zeros past kend (the slice's last, partial step).
// kVec16: one 16-byte non-coherent load (row starts and kend are multiples of 16); else byte loads.
template <bool kVec16, bool kMasked>
FP8SERVE_DEVICE uint4 load_codes(const std::uint8_t* row, int64_t k, int64_t kend) {
  if constexpr (kVec16) {
    if (!kMasked || k < kend) return __ldg(reinterpret_cast<const uint4*>(row + k));
    return make_uint4(0, 0, 0, 0);
  } else {
    std::uint32_t words[4] = {0, 0, 0, 0};
FP8SERVE_UNROLL
    for (int i = 0; i < 16; ++i) {
      if (!kMasked || k + i < kend) words[i / 4] |= std::uint32_t{row[k + i]} << (8 * (i % 4));
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// The powers of two that put amax in [2^15, 2^16): shift = 142 - exponent (a subnormal amax counts
// as 2^-126), in [-113, 141], applied as two factors, each a normal fp32.
struct XScale {
  float up_lo, up_hi;
  FP8SERVE_DEVICE explicit XScale(float amax) {
    const int exponent = max(static_cast<int>((__float_as_uint(amax) >> 23) & 0xff), 1);
    const int shift = 142 - exponent, half = shift / 2;
    up_lo = __uint_as_float(static_cast<unsigned>(127 + half) << 23);
    up_hi = __uint_as_float(static_cast<unsigned>(127 + shift - half) << 23);
  }
  FP8SERVE_DEVICE std::uint16_t f16(std::uint16_t bf16) const {
    return __half_raw(__float2half_rn(bf16_decode(bf16) * up_lo * up_hi)).x;
  }
  FP8SERVE_DEVICE float inverse() const { return 1.0f / up_lo / up_hi; }  // 2^-141 is subnormal: exact
};

// One token row of x[:, kbeg .. kbeg + len) staged as f16 into dst (zeros past len, up to staged;
// all zeros for a row past m), by one warp; returns the row's scale (its maximum is a warp
// reduction). Two ways that compute the same maximum and the same f16 values:
// 16-byte aligned rows (x_vec16): each lane loads its <= 4 vectors of 8 once and keeps them in
// registers for the conversion.
FP8SERVE_DEVICE XScale stage_row_vec16(const std::uint16_t* src, bool live, int len, int staged, uint4* dst) {
  constexpr int kVecs = kMaxSlice / (8 * kWarpSize);
  static_assert(kVecs * 8 * kWarpSize == kMaxSlice);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  uint4 v[kVecs];
  float amax = 0.0f;
FP8SERVE_UNROLL
  for (int j = 0; j < kVecs; ++j) {
    const int i = (j * kWarpSize + lane) * 8;
    v[j] = live && i < len ? __ldg(reinterpret_cast<const uint4*>(src + i)) : make_uint4(0, 0, 0, 0);
    const std::uint32_t words[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
FP8SERVE_UNROLL
    for (int w = 0; w < 4; ++w) {
      amax = fmaxf(amax, fabsf(bf16_decode(static_cast<std::uint16_t>(words[w] & 0xffffu))));
      amax = fmaxf(amax, fabsf(bf16_decode(static_cast<std::uint16_t>(words[w] >> 16))));
    }
  }
  const XScale scale(warp_reduce(amax, MaxOp{}));
FP8SERVE_UNROLL
  for (int j = 0; j < kVecs; ++j) {
    const int i = (j * kWarpSize + lane) * 8;
    if (i >= staged) break;
    const std::uint32_t words[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
    std::uint32_t f16[4];
FP8SERVE_UNROLL
    for (int w = 0; w < 4; ++w) {
      f16[w] = scale.f16(static_cast<std::uint16_t>(words[w] & 0xffffu)) |
               std::uint32_t{scale.f16(static_cast<std::uint16_t>(words[w] >> 16))} << 16;
    }
    dst[i / 8] = make_uint4(f16[0], f16[1], f16[2], f16[3]);
  }
  return scale;
}

// Any other row: one element a lane at a time, read twice.
FP8SERVE_DEVICE XScale stage_row_elements(const std::uint16_t* src, bool live, int len, int staged, uint4* dst) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float amax = 0.0f;
  if (live) {
    for (int i = lane; i < len; i += kWarpSize) amax = fmaxf(amax, fabsf(bf16_decode(src[i])));
  }
  const XScale scale(warp_reduce(amax, MaxOp{}));
  std::uint16_t* out = reinterpret_cast<std::uint16_t*>(dst);
  for (int i = lane; i < staged; i += kWarpSize) out[i] = live && i < len ? scale.f16(src[i]) : 0;
  return scale;
}

// Stages token rows [0, kTiles * 8) of x's slice, and each row's inverse scale: warp w stages rows
// w, w + 8.
template <int kTiles>
FP8SERVE_DEVICE void stage_x(const GemvArgs& a, int64_t kbeg, int len, int staged, uint4 (*xs)[kStageVecs],
                             float* unscale) {
  static_assert(kWarps == 8, "a warp stages one row of each token tile");
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
FP8SERVE_UNROLL
  for (int tile = 0; tile < kTiles; ++tile) {
    const int row = tile * 8 + warp;
    const bool live = row < a.m;
    const std::uint16_t* src = a.x + (live ? row : 0) * a.x_stride + kbeg;
    const XScale scale = a.x_vec16 ? stage_row_vec16(src, live, len, staged, xs[row])
                                   : stage_row_elements(src, live, len, staged, xs[row]);
    if (lane == 0) unscale[row] = scale.inverse();
  }
}

// blockIdx.x: 128 rows of W; blockIdx.y: the k slice. kTiles: token tiles of 8 (m <= 8 * kTiles).
// kBlocked: block scales. kVec16: 16-byte loads of W (k % 16 == 0 and W 16-byte aligned).
template <int kTiles, bool kBlocked, bool kVec16>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) linear_fp8_gemv_kernel(const GemvArgs a) {
  using Stage = uint4[kTiles * 8][kStageVecs];  // f16 [token][k], 16-byte aligned rows
  FP8SERVE_SHARED(Stage, xs);
  FP8SERVE_SHARED(float[kTiles * 8], unscale);
  const int64_t kbeg = static_cast<int64_t>(blockIdx.y) * a.slice;
  const int64_t kend = kbeg + a.slice < a.k ? kbeg + a.slice : a.k;
  const int len = static_cast<int>(kend - kbeg);
  const int staged = (len + kStep - 1) / kStep * kStep;

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int64_t row_a = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp + g;
  const int64_t row_b = row_a + 8;
  // Rows past n read row n - 1 (real memory, no branch in the loop) and are never stored.
  const int64_t read_a = row_a < a.n ? row_a : a.n - 1, read_b = row_b < a.n ? row_b : a.n - 1;
  const std::uint8_t* wa = a.w + read_a * a.k;
  const std::uint8_t* wb = a.w + read_b * a.k;
  // Two accumulator chains: mma step s of a chunk adds into [s % 2].
  float acc[2][kTiles][4] = {};
  float part[2][kTiles][4] = {};  // kBlocked: the current block's sums
  // kBlocked: chunks left in the current block (slices start on block boundaries, or are
  // whole-block pieces of blocks larger than a slice).
  const int64_t block_chunks = a.block_k / kChunk;
  int64_t chunks_left = (a.block_k - kbeg % a.block_k) / kChunk;

  // Two register buffers of one step's codes (8 x 16 bytes a lane), in turn: the loads of the
  // next step are in flight while this one converts and multiplies.
  uint4 buf_a[2][kChunksPerStep], buf_b[2][kChunksPerStep];
  auto load_step = [&](int local, uint4 (&buf)[2][kChunksPerStep]) {
    const int64_t k0 = kbeg + local + t * 16;
    if (local + kStep <= len) {
FP8SERVE_UNROLL
      for (int c = 0; c < kChunksPerStep; ++c) {
        buf[0][c] = load_codes<kVec16, false>(wa, k0 + c * kChunk, kend);
        buf[1][c] = load_codes<kVec16, false>(wb, k0 + c * kChunk, kend);
      }
    } else {
FP8SERVE_UNROLL
      for (int c = 0; c < kChunksPerStep; ++c) {
        buf[0][c] = load_codes<kVec16, true>(wa, k0 + c * kChunk, kend);
        buf[1][c] = load_codes<kVec16, true>(wb, k0 + c * kChunk, kend);
      }
    }
  };
  auto compute_step = [&](int local, const uint4 (&buf)[2][kChunksPerStep]) {
FP8SERVE_UNROLL
    for (int c = 0; c < kChunksPerStep; ++c) {
      const int at = local + c * kChunk;
      if (at >= len) break;  // warp-uniform: the slice's last step may be partial
      // B: x[token g (+8 per tile)][at + 16t .. + 15], 32 bytes, for the 4 mma steps.
      uint4 xb[kTiles][2];
FP8SERVE_UNROLL
      for (int tile = 0; tile < kTiles; ++tile) {
        const uint4* p = &xs[tile * 8 + g][(at + t * 16) / 8];
        xb[tile][0] = p[0];
        xb[tile][1] = p[1];
      }
      const std::uint32_t wa_words[4] = {buf[0][c].x, buf[0][c].y, buf[0][c].z, buf[0][c].w};
      const std::uint32_t wb_words[4] = {buf[1][c].x, buf[1][c].y, buf[1][c].z, buf[1][c].w};
FP8SERVE_UNROLL
      for (int s = 0; s < 4; ++s) {
        const std::uint32_t frag_a[4] = {
            ptx::cvt_f16x2_e4m3x2(static_cast<std::uint16_t>(wa_words[s] & 0xffffu)),
            ptx::cvt_f16x2_e4m3x2(static_cast<std::uint16_t>(wb_words[s] & 0xffffu)),
            ptx::cvt_f16x2_e4m3x2(static_cast<std::uint16_t>(wa_words[s] >> 16)),
            ptx::cvt_f16x2_e4m3x2(static_cast<std::uint16_t>(wb_words[s] >> 16))};
FP8SERVE_UNROLL
        for (int tile = 0; tile < kTiles; ++tile) {
          const uint4& pair = xb[tile][s / 2];
          const std::uint32_t frag_b[2] = {s % 2 == 0 ? pair.x : pair.z, s % 2 == 0 ? pair.y : pair.w};
          if constexpr (kBlocked) {
            ptx::mma_m16n8k16_f16(part[s % 2][tile], frag_a, frag_b);
          } else {
            ptx::mma_m16n8k16_f16(acc[s % 2][tile], frag_a, frag_b);
          }
        }
      }
      if constexpr (kBlocked) {
        if (--chunks_left == 0 || at + kChunk >= len) {
          const int64_t block = (kbeg + at) / a.block_k;
          const float scale_a = a.scales[read_a * a.k_blocks + block];
          const float scale_b = a.scales[read_b * a.k_blocks + block];
FP8SERVE_UNROLL
          for (int tile = 0; tile < kTiles; ++tile) {
FP8SERVE_UNROLL
            for (int e = 0; e < 4; ++e) {
              acc[0][tile][e] = fmaf(part[0][tile][e] + part[1][tile][e], e < 2 ? scale_a : scale_b, acc[0][tile][e]);
              part[0][tile][e] = part[1][tile][e] = 0.0f;
            }
          }
          chunks_left = block_chunks;
        }
      }
    }
  };
  load_step(0, buf_a);  // in flight while x is staged
  stage_x<kTiles>(a, kbeg, len, staged, xs, unscale);
  __syncthreads();
  for (int local = 0; local < len; local += 2 * kStep) {
    if (local + kStep < len) load_step(local + kStep, buf_b);
    compute_step(local, buf_a);
    if (local + kStep >= len) break;
    if (local + 2 * kStep < len) load_step(local + 2 * kStep, buf_a);
    compute_step(local + kStep, buf_b);
  }

  // D: d[0..1] = (row g, tokens 2t, 2t+1), d[2..3] = (row g + 8, the same tokens), per tile.
  float* out = a.partial + static_cast<int64_t>(blockIdx.y) * a.m * a.n;
FP8SERVE_UNROLL
  for (int tile = 0; tile < kTiles; ++tile) {
FP8SERVE_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int token = tile * 8 + 2 * t + e % 2;
      const int64_t row = e < 2 ? row_a : row_b;
      const float sum = kBlocked ? acc[0][tile][e] : acc[0][tile][e] + acc[1][tile][e];
      if (token < a.m && row < a.n) out[token * a.n + row] = sum * unscale[token];
    }
  }

  // The last CTA of this row block adds every split's partials, in split order.
  FP8SERVE_SHARED(unsigned[1], last);
  __threadfence();  // our partials are visible before our ticket
  __syncthreads();
  if (threadIdx.x == 0) last[0] = atomicAdd(&a.tickets[blockIdx.x], 1u) == gridDim.y - 1 ? 1u : 0u;
  __syncthreads();
  if (last[0] == 0) return;
  __threadfence();
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  for (int i = static_cast<int>(threadIdx.x); i < a.m * kRowsPerBlock; i += kThreads) {
    const int64_t token = i / kRowsPerBlock, o = row0 + i % kRowsPerBlock;
    if (o >= a.n) continue;
    float sum = 0.0f;
    for (unsigned split = 0; split < gridDim.y; ++split) sum += __ldcg(&a.partial[(split * a.m + token) * a.n + o]);
    if (a.row_scales != nullptr) sum *= a.row_scales[o];
    if (a.bias != nullptr) sum += bf16_decode(a.bias[o]);
    if (a.y_fp32) {
      static_cast<float*>(a.y)[token * a.y_stride + o] = sum;
    } else {
      static_cast<std::uint16_t*>(a.y)[token * a.y_stride + o] = bf16_encode(sum);
    }
  }
  if (threadIdx.x == 0) a.tickets[blockIdx.x] = 0;  // for the next launch (stream order)
}

template <int kTiles, bool kBlocked>
void launch_gemv(const GemvArgs& a, bool vec16, dim3 grid, cudaStream_t stream) {
  if (vec16) {
    FP8SERVE_LAUNCH((linear_fp8_gemv_kernel<kTiles, kBlocked, true>), grid, dim3(kThreads), 0, stream, a);
  } else {
    FP8SERVE_LAUNCH((linear_fp8_gemv_kernel<kTiles, kBlocked, false>), grid, dim3(kThreads), 0, stream, a);
  }
}

}  // namespace

Fp8GemvPlan plan_linear_fp8_gemv(int64_t in_features, int64_t out_features, int64_t weight_block_k) {
  const int64_t block_k = weight_block_k > 0 ? weight_block_k : in_features;
  // Slices are whole 64-input chunks, whole blocks when a block fits a slice.
  const int64_t unit = weight_block_k > 0 && block_k <= kMaxSlice ? block_k / kChunk : 1;
  const int64_t chunks = div_up(in_features, kChunk);
  const int64_t row_blocks = div_up(out_features, kRowsPerBlock);
  // At most the stage; at least a full step of loads (unless the row is shorter).
  const int64_t longest = std::min(int64_t{kMaxSlice / kChunk} / unit * unit, div_up(chunks, unit) * unit);
  const int64_t shortest = std::min(div_up(kStep / kChunk, unit) * unit, longest);
  // Each split count's balanced slice, weighed as rounds of kSlots CTAs x (a CTA's fixed cost + its
  // chunks); the cheapest wins, the fewest splits among equals.
  int64_t best_cost = -1, best = longest;
  for (int64_t splits = div_up(chunks, longest); splits <= div_up(chunks, shortest); ++splits) {
    const int64_t per_slice = std::max(div_up(div_up(chunks, splits), unit) * unit, shortest);
    const int64_t rounds = div_up(row_blocks * div_up(chunks, per_slice), kSlots);
    const int64_t cost = rounds * (kFixedChunks + per_slice);
    if (best_cost < 0 || cost < best_cost) best_cost = cost, best = per_slice;
  }
  Fp8GemvPlan plan;
  plan.slice = best * kChunk;
  plan.splits = div_up(in_features, plan.slice);
  return plan;
}

std::size_t linear_fp8_gemv_workspace_bytes(int64_t num_tokens, int64_t in_features, int64_t out_features,
                                            int64_t weight_block_k) {
  const Fp8GemvPlan plan = plan_linear_fp8_gemv(in_features, out_features, weight_block_k);
  const int64_t rows = std::min<int64_t>(num_tokens, kFp8GemvMaxTokens);
  return static_cast<std::size_t>(plan.splits * rows * out_features) * sizeof(float);
}

int64_t linear_fp8_gemv_tickets(int64_t out_features) { return div_up(out_features, kRowsPerBlock); }

void linear_fp8_gemv_cuda(const LinearParams& p, void* workspace, std::size_t workspace_bytes, unsigned* tickets,
                          int64_t num_tickets, cudaStream_t stream) {
  check_linear_params(p, "linear (cuda, FP8 weights)");
  if (p.weight_dtype != WeightDtype::fp8_e4m3)
    throw std::invalid_argument("linear (cuda, FP8 GEMV): FP8 weights only; bf16 weights run on cuBLASLt");
  if (p.num_tokens == 0) return;
  if (workspace_bytes < linear_fp8_gemv_workspace_bytes(p.num_tokens, p.in_features, p.out_features, p.weight_block_k))
    throw std::invalid_argument("linear (cuda, FP8 GEMV): workspace too small");
  if (num_tickets < linear_fp8_gemv_tickets(p.out_features))
    throw std::invalid_argument("linear (cuda, FP8 GEMV): too few tickets");
  const Fp8GemvPlan plan = plan_linear_fp8_gemv(p.in_features, p.out_features, p.weight_block_k);
  const int64_t row_blocks = div_up(p.out_features, kRowsPerBlock);
  // coverage: 2^31 x 128 output rows, or 65536 slices of 64 inputs: no real projection
  if (row_blocks > 0x7fffffff || plan.splits > 65535)
    throw std::invalid_argument("linear (cuda, FP8 GEMV): shape too large for one launch");
  GemvArgs a{};
  a.w = static_cast<const std::uint8_t*>(p.weight);
  a.scales = p.weight_scales;
  a.partial = static_cast<float*>(workspace);
  a.tickets = tickets;
  a.bias = p.bias;
  a.y_stride = p.y_stride ? p.y_stride : p.out_features;
  a.y_fp32 = p.y_fp32;
  a.x_stride = p.x_stride ? p.x_stride : p.in_features;
  a.x_vec16 = aligned_to(p.x, 16) && a.x_stride % 8 == 0 && p.in_features % 8 == 0;
  a.block_k = p.weight_block_k > 0 ? p.weight_block_k : p.in_features;
  a.k_blocks = weight_num_k_blocks(p.in_features, p.weight_block_k);
  a.n = p.out_features;
  a.k = p.in_features;
  a.slice = plan.slice;
  const bool blocked = p.weight_block_k > 0;
  a.row_scales = blocked ? nullptr : p.weight_scales;
  const bool vec16 = p.in_features % 16 == 0 && aligned_to(p.weight, 16);
  const std::size_t y_bytes = p.y_fp32 ? 4 : 2;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(plan.splits));
  // Groups of up to 16 tokens, a launch each; a group's rows are computed exactly as they would be
  // alone (batch invariance holds across groups too).
  for (int64_t t0 = 0; t0 < p.num_tokens; t0 += kFp8GemvMaxTokens) {
    a.m = std::min<int64_t>(p.num_tokens - t0, kFp8GemvMaxTokens);
    a.x = static_cast<const std::uint16_t*>(p.x) + t0 * a.x_stride;
    a.y = static_cast<char*>(p.y) + static_cast<std::size_t>(t0 * a.y_stride) * y_bytes;
    if (a.m > 8) {
      blocked ? launch_gemv<2, true>(a, vec16, grid, stream) : launch_gemv<2, false>(a, vec16, grid, stream);
    } else {
      blocked ? launch_gemv<1, true>(a, vec16, grid, stream) : launch_gemv<1, false>(a, vec16, grid, stream);
    }
    CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace fp8serve::cuda
