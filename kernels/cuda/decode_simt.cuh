#pragma once
// The decode attention on CUDA cores (paged_attention_decode.cu runs it for GQA groups below
// kMmaMinGroup): one warp's online softmax over its chunks (decode_stage.cuh), in fp32.
//  - scores: one lane's 16-byte K vector is 4 tokens x P dims (P = 4 FP8 or 2 bf16); it
//    multiplies them with the q values of those dims for every head of its rows (q reused 4x)
//    and a butterfly over the lanes that hold the same 4 tokens completes the dot products;
//  - p.V: each lane owns 4 (8 at head_dim 256) dims of the output of every row and sums over the
//    chunk's tokens, reading p from shared memory: no cross-lane reduction per chunk.
#include "kernels/cuda/decode_stage.cuh"

namespace fp8serve::cuda::attn {

namespace {

// Dims of the output one lane owns in the p.V product.
template <int kD>
constexpr int dims_per_lane() {
  return kD >= 256 ? 8 : 4;
}

// CTAs per SM the kernel is built for (__launch_bounds__): 4 (128 registers) for 1-2 rows, 3 (168)
// for 4 - left to itself ptxas takes more than that and an SM holds one CTA fewer - except
// <256, 2>, which spills at 128: 3; 8 rows need ~230 registers: 2.
template <int kD, int kRows>
constexpr int kSimtMinCtas = kRows <= 2 ? (kD == 256 && kRows == 2 ? 3 : 4) : kRows == 4 ? 3 : 1;

template <int kD, int kRows>
struct DecodeSimtCta {
  static constexpr int kDl = dims_per_lane<kD>();
  static constexpr int kLanesPerRow = kD / kDl;       // lanes sharing one token in p.V
  static constexpr int kRowGroups = kWarp / kLanesPerRow;
  static constexpr bool kQkScaleInQ = true;           // q_s holds q * qk_scale
  static constexpr bool kPRows = true;                // p_s in shared memory
  static constexpr int kQRow = kD;                    // q_s: plain rows (16-byte reads)
  static ATTN_HD int q_index(int row, int d) { return row * kQRow + d; }

  // A warp's running softmax over its chunks: max and sum per row (the same in every lane) and
  // the lane's dims of the unnormalised output.
  struct State {
    float m[kRows];
    float l[kRows];
    float acc[kRows][kDl];
  };

  const AttentionArgs& args;
  unsigned char* smem;
  int lane, warp;

  ATTN_DEVICE void begin(State& st) const {
ATTN_UNROLL
    for (int r = 0; r < kRows; ++r) {
      st.m[r] = -INFINITY;
      st.l[r] = 0.0f;
ATTN_UNROLL
      for (int e = 0; e < kDl; ++e) st.acc[r][e] = 0.0f;
    }
  }

  // One segment through this warp's stages. kKFp8 / kVFp8: its K / V are E4M3 (else bf16).
  template <bool kKFp8, bool kVFp8>
  ATTN_DEVICE void run_segment(const KeySegment& seg, State& st) {
    using Shape = ChunkShape<kD, kKFp8 ? 1 : 2, kVFp8 ? 1 : 2>;
    constexpr int kVElem = kVFp8 ? 1 : 2;
    const int block_size = args.cache.block_size, head_dim = args.head_dim;
    const Shape sh(block_size, head_dim);
    const int chunk = sh.chunk, quads = sh.quads;
    const int first_chunk = seg.lo >> sh.chunk_shift;
    const int num_chunks = ((seg.hi + chunk - 1) >> sh.chunk_shift) - first_chunk;
    const float* q_s = reinterpret_cast<const float*>(smem + decode_smem(kRows, kQRow, 0).q);
    float* p_s = reinterpret_cast<float*>(smem + decode_smem(kRows, kQRow, 0).p) + warp * kMaxChunkTokens * kRows;
    auto unswizzled = [](int) { return 0; };

    const ChunkCopy<Shape> copy(seg, sh, block_size, lane, unswizzled, unswizzled);
    auto issue = [&](int c, unsigned char* stage) {
      copy.issue(seg, block_size, (first_chunk + c) << sh.chunk_shift, stage);
    };

    auto compute = [&](int c, const unsigned char* stage) {
      const int pos0 = (first_chunk + c) << sh.chunk_shift;
      // Scores of tokens 4 * (lane % quads) + w, partial over this lane's groups.
      float part[4][kRows];
ATTN_UNROLL
      for (int w = 0; w < 4; ++w)
ATTN_UNROLL
        for (int r = 0; r < kRows; ++r) part[w][r] = 0.0f;
ATTN_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int v = lane + kWarp * i;
        if (v < sh.k_vectors) {
          const int group = v >> sh.quad_shift;
          const uint4 raw = *reinterpret_cast<const uint4*>(stage + v * 16);
          const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};  // tokens 4 quad + w
          if constexpr (kKFp8) {  // each word: dims 4 group .. 4 group + 3
            float k[4][4];
ATTN_UNROLL
            for (int w = 0; w < 4; ++w) fp8x4_to_float(words[w], k[w]);
ATTN_UNROLL
            for (int r = 0; r < kRows; ++r) {
              const float4 q = *reinterpret_cast<const float4*>(q_s + r * kD + 4 * group);
ATTN_UNROLL
              for (int w = 0; w < 4; ++w) {  // one FMA per product
                part[w][r] += q.x * k[w][0];
                part[w][r] += q.y * k[w][1];
                part[w][r] += q.z * k[w][2];
                part[w][r] += q.w * k[w][3];
              }
            }
          } else {  // each word: dims 2 group, 2 group + 1
ATTN_UNROLL
            for (int r = 0; r < kRows; ++r) {
              const float2 q = *reinterpret_cast<const float2*>(q_s + r * kD + 2 * group);
ATTN_UNROLL
              for (int w = 0; w < 4; ++w) {
                part[w][r] += q.x * bf16_lo(words[w]);
                part[w][r] += q.y * bf16_hi(words[w]);
              }
            }
          }
        }
      }
      // Complete the dot products over the lanes holding the same tokens (lane % quads).
      for (int offset = quads; offset < kWarp; offset <<= 1)
ATTN_UNROLL
        for (int w = 0; w < 4; ++w)
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) part[w][r] += __shfl_xor_sync(kAllLanes, part[w][r], offset);

      const int first_token = pos0 + 4 * (lane & (quads - 1));
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float chunk_max = -INFINITY;
ATTN_UNROLL
        for (int w = 0; w < 4; ++w) {
          const int pos = first_token + w;
          part[w][r] = pos >= seg.lo && pos < seg.hi ? part[w][r] * seg.k_scale : -INFINITY;
          chunk_max = fmaxf(chunk_max, part[w][r]);
        }
        for (int offset = 1; offset < quads; offset <<= 1)
          chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kAllLanes, chunk_max, offset));
        const float m_new = fmaxf(st.m[r], chunk_max);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no NaN
        const float alpha = exp2f(st.m[r] - m_use);
        float chunk_sum = 0.0f;
ATTN_UNROLL
        for (int w = 0; w < 4; ++w) {
          part[w][r] = exp2f(part[w][r] - m_use);
          chunk_sum += part[w][r];
        }
        for (int offset = 1; offset < quads; offset <<= 1)
          chunk_sum += __shfl_xor_sync(kAllLanes, chunk_sum, offset);
        st.l[r] = st.l[r] * alpha + chunk_sum;
        st.m[r] = m_new;
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) st.acc[r][e] *= alpha;
      }
      if (lane < quads) {
ATTN_UNROLL
        for (int w = 0; w < 4; ++w)
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) p_s[(4 * lane + w) * kRows + r] = part[w][r] * seg.v_scale;
      }
      __syncwarp();

      // p.V: this lane's dims of every row, over the tokens t = lane / kLanesPerRow (mod kRowGroups).
      const int dim0 = lane % kLanesPerRow * kDl;
      if (dim0 < head_dim) {
        for (int t = lane / kLanesPerRow; t < chunk; t += kRowGroups) {
          float v[kDl];
          const unsigned char* row = stage + kChunkBytes + (t * kD + dim0) * kVElem;
          if constexpr (kVFp8) {
ATTN_UNROLL
            for (int h = 0; h < kDl / 4; ++h) {
              float four[4];
              fp8x4_to_float(reinterpret_cast<const uint32_t*>(row)[h], four);
ATTN_UNROLL
              for (int e = 0; e < 4; ++e) v[4 * h + e] = four[e];
            }
          } else {
ATTN_UNROLL
            for (int h = 0; h < kDl / 2; ++h) {
              const uint32_t pair = reinterpret_cast<const uint32_t*>(row)[h];
              v[2 * h] = bf16_lo(pair);
              v[2 * h + 1] = bf16_hi(pair);
            }
          }
          float p[kRows];
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r) p[r] = p_s[t * kRows + r];
ATTN_UNROLL
          for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
            for (int e = 0; e < kDl; ++e) st.acc[r][e] += p[r] * v[e];
        }
      }
      __syncwarp();  // the stage and p_s are rewritten next
    };

    stream_chunks(smem + warp * kWarpStageBytes, warp, num_chunks, issue, compute);
  }

  // Writes this warp's unnormalised output [kRows][kD], then m[kRows] and l[kRows], to `mine`.
  ATTN_DEVICE void publish(State& st, float* mine) const {
    for (int offset = kLanesPerRow; offset < kWarp; offset <<= 1)
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) st.acc[r][e] += __shfl_xor_sync(kAllLanes, st.acc[r][e], offset);
    if (lane < kLanesPerRow) {
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
        for (int e = 0; e < kDl; ++e) mine[r * kD + lane * kDl + e] = st.acc[r][e];
    }
    if (lane == 0) {
ATTN_UNROLL
      for (int r = 0; r < kRows; ++r) {
        mine[kRows * kD + r] = st.m[r];
        mine[kRows * kD + kRows + r] = st.l[r];
      }
    }
  }
};

}  // namespace

}  // namespace fp8serve::cuda::attn
