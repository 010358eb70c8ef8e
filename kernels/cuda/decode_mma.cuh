#pragma once
// The decode attention on tensor cores (paged_attention_decode.cu runs it for GQA groups of
// kMmaMinGroup and more): the item's query heads are the A operand of mma.sync m16n8k16 (16 rows:
// 8 heads in rows g, or 16 in rows g and g + 8; the rest zero), the chunk's keys B, fp32
// accumulators throughout.
//  - Q: the A fragment of each k-step is built from the item's q in shared memory for each chunk
//    (one 16-byte load, four multiplies, two conversions) rather than held in registers: the MMA's A operand is 4
//    consecutive registers, zero rows included, so holding all head_dim / 16 of them took 32
//    registers and 4 CTAs per SM (128 registers) out of reach. For FP8 K they are f16: q (bf16)
//    times 2^e, e chosen so that the item's largest |q| lands in [2^14, 2^15), is exact in f16
//    (8 significant bits; only values below 2^-28 of the largest lose bits, as f16 subnormals),
//    and 2^-e joins qk_scale and the K scale in the score scale. For bf16 K they are bf16 (q as it
//    is) and the MMA is the bf16 one: bf16 keys do not fit f16's range (65504), so converting them
//    could overflow.
//  - S = Q K^T: the k order within a k-step is ours to choose (Q's A fragment uses the same), so
//    a lane's b[0] (k = 2t, 2t+1) and b[1] (2t+8, 2t+9) of token g are dims 4t..4t+3 of the
//    k-step: one 32-bit shared load of the staged FP8 word, two cvt.rn.f16x2.e4m3x2. (bf16 K:
//    two 32-bit loads, no conversion.)
//  - online softmax on the accumulators (rows g, g + 8; a quad's 4 lanes share a row: two xor
//    shuffles for the max; the sums stay per lane until the end); O is rescaled only when some
//    row's max grew (a warp vote), as 16 n-tiles x 4 accumulators cost 64 FMULs.
//  - P V as O^T = V^T P^T: V^T is the A operand (16 dims x 16 tokens), P^T the B operand, and a
//    lane's B fragment (b[0] = P[head g][tokens 2t, 2t+1]) is exactly what its S accumulators
//    hold (FlashAttention-2's register reuse without a shuffle); the heads are the N side, 8 per
//    MMA, so a group of up to 8 wastes nothing here and O^T takes head_dim / 4 registers per
//    lane. P stays in [0, 1], unscaled: f16 for FP8 V (V's scale is applied to O instead), bf16
//    for bf16 V (the MMA's types must match). m-tile 2m + p: row g is dim 32m + 4g + 2p, row
//    g + 8 dim 32m + 4g + 2p + 1, so one 32-bit load per token row (two for bf16) serves two
//    m-tiles, a byte permute pairs two tokens' bytes, one cvt per register.
//  - staging: K word column w's 4-token vectors are XOR-swizzled by (w * C / 32) * 2 and V rows'
//    16-byte vectors by a multiple of (row / 2) % 4, so that the lanes of one shared load (8
//    tokens x 4 word columns for K; 4 token rows x 32 bytes for V) fall in distinct banks at
//    head_dim 128 and 256.
// Count per 4 KiB chunk (FP8, head_dim 128, 16 tokens): S 8 k-steps x (Q: 1 load, 4 multiplies,
// 2 cvt; 2 n-tiles x (1 load, 2 cvt, 1 mma)); P V 4 x (4 loads, 4 prmt, 8 cvt, 2 mma per 8
// heads); the softmax ~50; the copy ~40: ~350 issue slots at any group up to 16, against the ~892
// that 4.8 TB/s allows. The SASS has about twice that (address arithmetic, the copy's block
// lookups): tests/scripts/sass_count.py, docs/cuda.md.
#include "kernels/cuda/decode_stage.cuh"

namespace fp8serve::cuda::attn {

namespace {

// GQA groups this large go to the tensor-core decode (FlashInfer switches at the same group):
// below it the CUDA-core kernel's instruction count per byte fits the issue budget (docs/cuda.md:
// the static counts), and a 16-row MMA would be mostly padding.
constexpr int kMmaMinGroup = 4;
// ... and head dims up to 128: at 256, O^T (kD / 4 registers per 8 heads) and the Q fragments
// (kD / 8 per 8 heads) leave the rest of the kernel too few of its 255 registers (ptxas spilled);
// the CUDA-core kernel serves head_dim 256 at every group.
constexpr int kMmaMaxHeadDim = 128;

// CTAs per SM the kernel is built for (__launch_bounds__): 4 (128 registers) for 8 heads per item,
// 2 for 16, whose O^T and Q fragments take twice the registers. Either keeps 2 chunks per warp in
// flight for 4 x 4 (2 x 4) warps: 128 (64) KiB per SM against the ~25 KiB that HBM's latency needs.
template <int kRows>
constexpr int kMmaMinCtas = kRows <= 8 ? 4 : 2;

// K word column w's swizzle in a kChunk-token stage: (w * kChunk / 32) * 2, mod the chunk's 4-token
// vectors per column. It depends on w mod 4 only, which ChunkCopy relies on (checked below).
template <int kChunk>
ATTN_HD constexpr int k_swizzle_of(int w) {
  constexpr int kShift = kChunk == 8 ? 2 : kChunk == 16 ? 1 : 0;  // log2 of the word columns per 32 banks
  return (w >> kShift << 1) & (kChunk / 4 - 1);
}
template <int kChunk>
constexpr bool k_swizzle_by_column_mod_4() {
  for (int w = 0; w < 256; ++w)
    if (k_swizzle_of<kChunk>(w) != k_swizzle_of<kChunk>(w % 4)) return false;
  return true;
}
static_assert(k_swizzle_by_column_mod_4<8>() && k_swizzle_by_column_mod_4<16>() && k_swizzle_by_column_mod_4<32>(),
              "ChunkCopy stages K vectors 32 apart 512 bytes apart");

template <int kD, int kRows>
struct DecodeMmaCta {
  static_assert(kRows == 8 || kRows == 16, "one MMA row block: 8 heads (rows g) or 16 (g and g + 8)");
  static constexpr bool kUpper = kRows > 8;  // rows g + 8 hold heads
  static constexpr int kSteps = kD / 16;     // k-steps of S over head_dim; m-tiles of O^T
  static constexpr int kHeadTiles = kRows / 8;  // n-tiles of O^T: 8 heads each
  static constexpr bool kQkScaleInQ = false; // q_s holds q as it is: exact in the fragments
  static constexpr bool kPRows = false;
  static constexpr int kQRow = kD + 32;      // q_s row stride in floats (q_index)

  struct State {
    float o[kHeadTiles][kSteps][4];  // O^T, unnormalised, in units of o_scale (see run_segment)
    float m[2], l[2];    // rows g, g + 8: max (log2 units), this lane's part of the sum
    float o_scale;
  };

  const AttentionArgs& args;
  unsigned char* smem;
  int lane, warp;

  ATTN_DEVICE void begin(State& st) const {
ATTN_UNROLL
    for (int h = 0; h < kHeadTiles; ++h)
ATTN_UNROLL
      for (int n = 0; n < kSteps; ++n)
ATTN_UNROLL
        for (int e = 0; e < 4; ++e) st.o[h][n][e] = 0.0f;
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.0f;
    st.o_scale = 1.0f;
  }

  // Where q's element (row, d) sits in q_s: rows kQRow = kD + 32 floats apart, row g's start moved by
  // 2 (g odd) and 16 (g & 2) floats, so that q_fragment's LDS.64 over 8 rows x 4 columns take
  // 2 wavefronts for FP8 K (f16 columns 4t + 2h) and 4 for bf16 K (2t + 8h), not 8 and 8: plain
  // fp32 rows 512 bytes apart share banks. A lane's offset is a constant; j and h stay immediates.
  static ATTN_HD int q_index(int row, int d) {
    return row * kQRow + ((row & 1) ? 2 : 0) + ((row & 2) ? 16 : 0) + d;
  }

  // Q's A fragment for k-step j (dims 16j + dim(h) .. + 1 in register pair h), read from q_s
  // for each chunk rather than held: 16 x 4 registers per k-step (the MMA's A is 4 consecutive
  // registers, zero rows included) would leave the kernel short of the 128 that 4 CTAs per SM
  // allow. kF16: f16 of q * q_mult, else bf16 of q.
  template <bool kF16>
  ATTN_DEVICE void q_fragment(int j, float q_mult, uint32_t (&a)[4]) const {
    const float* q_s = reinterpret_cast<const float*>(smem + decode_smem(kRows, kQRow, 0, false).q);
    const int g = lane / 4, t = lane % 4;
ATTN_UNROLL
      for (int h = 0; h < 2; ++h) {
        // FP8 K: k = 2t, 2t+1 | 2t+8, 2t+9 are dims 4t, 4t+1 | 4t+2, 4t+3; bf16 K: the PTX order.
        const int d = 16 * j + (kF16 ? 4 * t + 2 * h : 2 * t + 8 * h);
        auto pack = [&](int row) {
          const float x = q_s[q_index(row, d)] * q_mult, y = q_s[q_index(row, d) + 1] * q_mult;  // d even
          return kF16 ? ptx::cvt_f16x2_f32(x, y) : pack_bf16x2(x, y);
        };
        a[2 * h] = pack(g);
        a[2 * h + 1] = kUpper ? pack(g + 8) : 0u;
      }
  }

  // 2^e for q in f16 (see the header): from the largest |q| of the item's rows.
  ATTN_DEVICE float q_power_of_two() const {
    const float* q_s = reinterpret_cast<const float*>(smem + decode_smem(kRows, kQRow, 0, false).q);
    float amax = 0.0f;
ATTN_UNROLL
    for (int r = 0; r < kRows; ++r)
ATTN_UNROLL
      for (int d = lane; d < kD; d += kWarp) amax = fmaxf(amax, fabsf(q_s[q_index(r, d)]));
ATTN_UNROLL
    for (int offset = 1; offset < kWarp; offset <<= 1) amax = fmaxf(amax, __shfl_xor_sync(kAllLanes, amax, offset));
    const int exponent = static_cast<int>(__float_as_uint(amax) >> 23) - 127;  // amax >= 0; 0 and subnormals: -127
    const int e = amax == 0.0f ? 0 : max(-126, min(126, 14 - exponent));
    return __uint_as_float(static_cast<uint32_t>(127 + e) << 23);
  }

  // One segment: its chunks are min(block, 2 KiB of K) tokens, a constant of each instantiation
  // (stream_segment<.., kChunk>), so that the stage offsets fold into the loads' immediates.
  template <bool kKFp8, bool kVFp8>
  ATTN_DEVICE void run_segment(const KeySegment& seg, State& st) {
    constexpr int kMaxChunk = ChunkShape<kD, kKFp8 ? 1 : 2, kVFp8 ? 1 : 2>::kMaxChunk;
    const int block_size = args.cache.block_size;  // 8, 16 or 32
    if (block_size >= kMaxChunk) return stream_segment<kKFp8, kVFp8, kMaxChunk>(seg, st);
    if constexpr (kMaxChunk > 16) {
      if (block_size == 16) return stream_segment<kKFp8, kVFp8, 16>(seg, st);
    }
    if constexpr (kMaxChunk > 8) stream_segment<kKFp8, kVFp8, 8>(seg, st);
  }

  template <bool kKFp8, bool kVFp8, int kChunk>
  ATTN_DEVICE void stream_segment(const KeySegment& seg, State& st) {
    using Shape = ChunkShape<kD, kKFp8 ? 1 : 2, kVFp8 ? 1 : 2>;
    constexpr int kVElem = kVFp8 ? 1 : 2;
    constexpr int kMaxTiles = kChunk / 8;  // S n-tiles
    constexpr int chunk = kChunk;
    const int block_size = args.cache.block_size, head_dim = args.head_dim;
    const Shape sh(kChunk, head_dim);
    const int first_chunk = seg.lo >> sh.chunk_shift;
    const int num_chunks = ((seg.hi + chunk - 1) >> sh.chunk_shift) - first_chunk;
    const int g = lane / 4, t = lane % 4;

    // O is kept in units of this segment's V scale: P stays in [0, 1] for the MMA.
    if (seg.v_scale != st.o_scale) {
      const float ratio = st.o_scale / seg.v_scale;
ATTN_UNROLL
      for (int h = 0; h < kHeadTiles; ++h)
ATTN_UNROLL
        for (int n = 0; n < kSteps; ++n)
ATTN_UNROLL
          for (int e = 0; e < 4; ++e) st.o[h][n][e] *= ratio;
      st.o_scale = seg.v_scale;
    }
    const float q_mult = kKFp8 ? q_power_of_two() : 1.0f;
    const float score_scale = args.qk_scale * seg.k_scale / q_mult;  // exact: a power of two

    auto k_swizzle = [](int w) { return k_swizzle_of<kChunk>(w); };
    auto v_swizzle = [&](int row) { return (2 * kVElem * ((row >> 1) & 3)) & (Shape::kRowVectors - 1); };
    const ChunkCopy<Shape> copy(seg, sh, block_size, lane, k_swizzle, v_swizzle);
    auto issue = [&](int c, unsigned char* stage) {
      copy.issue(seg, block_size, (first_chunk + c) << sh.chunk_shift, stage);
    };

    // Stage offsets this lane reads, as registers per segment, so that each load in the loop is a
    // register plus an immediate: K word column t (+ 4j, a multiple: the swizzle depends on the
    // column mod 4 only), tokens 8nb + g; V rows r0 + 16kb + {0, 1, 8, 9} (whose swizzle is t's for
    // all of them), bytes kVElem (32m + 4g) of the row, moved to vector pair m ^ tv by the swizzle.
    int k_off[kMaxTiles];
ATTN_UNROLL
    for (int nb = 0; nb < kMaxTiles; ++nb)
      k_off[nb] = (t * chunk + ((((2 * nb) + (g >> 2)) ^ k_swizzle(t)) << 2) + (g & 3)) * 4;
    const int tv = v_swizzle(2 * t) / (2 * kVElem);
    int v_off[kD / 32];
ATTN_UNROLL
    for (int m = 0; m < kD / 32; ++m)
      v_off[m] = kChunkBytes + 2 * t * Shape::kRowVectors * 16 + kVElem * 4 * g + kVElem * 32 * (m ^ tv);

    auto compute = [&](int c, const unsigned char* stage) {
      const int pos0 = (first_chunk + c) << sh.chunk_shift;
      // S: n-tile nb is tokens 8nb..8nb+7.
      float s[kMaxTiles][4];
ATTN_UNROLL
      for (int nb = 0; nb < kMaxTiles; ++nb)
ATTN_UNROLL
        for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
ATTN_UNROLL
      for (int j = 0; j < kSteps; ++j) {
        if (16 * j >= head_dim) break;
        uint32_t qa[4];
        q_fragment<kKFp8>(j, q_mult, qa);
ATTN_UNROLL
        for (int nb = 0; nb < kMaxTiles; ++nb) {
          auto k_word = [&](int w) {  // w = t + a multiple of 4
            return *reinterpret_cast<const uint32_t*>(stage + k_off[nb] + (w - t) * chunk * 4);
          };
          if constexpr (kKFp8) {
            const uint32_t word = k_word(4 * j + t);
            const uint32_t b[2] = {ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(word & 0xffffu)),
                                   ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(word >> 16))};
            ptx::mma_m16n8k16_f16(s[nb], qa, b);
          } else {
            const uint32_t b[2] = {k_word(8 * j + t), k_word(8 * j + 4 + t)};
            ptx::mma_m16n8k16_bf16(s[nb], qa, b);
          }
        }
      }

      // Online softmax; element e of s[nb] is row g + 8 (e / 2), token 8nb + 2t + e % 2.
      float chunk_max[2] = {-INFINITY, -INFINITY};
ATTN_UNROLL
      for (int nb = 0; nb < kMaxTiles; ++nb)
ATTN_UNROLL
        for (int e = 0; e < (kUpper ? 4 : 2); ++e) {
          const int token = 8 * nb + 2 * t + e % 2, pos = pos0 + token;
          const bool keep = pos >= seg.lo && pos < seg.hi;
          s[nb][e] = keep ? s[nb][e] * score_scale : -INFINITY;
          chunk_max[e / 2] = fmaxf(chunk_max[e / 2], s[nb][e]);
        }
      float alpha[2] = {1.0f, 1.0f};
ATTN_UNROLL
      for (int h = 0; h < (kUpper ? 2 : 1); ++h) {
        chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(kAllLanes, chunk_max[h], 1));
        chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(kAllLanes, chunk_max[h], 2));
        const float m_new = fmaxf(st.m[h], chunk_max[h]);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no NaN
        alpha[h] = exp2f(st.m[h] - m_use);
        st.m[h] = m_new;
        chunk_max[h] = m_use;
      }
      float sum[2] = {0.0f, 0.0f};
ATTN_UNROLL
      for (int nb = 0; nb < kMaxTiles; ++nb)
ATTN_UNROLL
        for (int e = 0; e < (kUpper ? 4 : 2); ++e) {
          s[nb][e] = exp2f(s[nb][e] - chunk_max[e / 2]);
          sum[e / 2] += s[nb][e];
        }
ATTN_UNROLL
      for (int h = 0; h < 2; ++h) st.l[h] = st.l[h] * alpha[h] + sum[h];
      if (__any_sync(kAllLanes, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
        // O^T's columns are heads 2t, 2t + 1 (+ 8): their factors live in lanes 4 (2t) and 4 (2t + 1).
ATTN_UNROLL
        for (int h = 0; h < kHeadTiles; ++h) {
          const float f0 = __shfl_sync(kAllLanes, alpha[h], 8 * t), f1 = __shfl_sync(kAllLanes, alpha[h], 8 * t + 4);
ATTN_UNROLL
          for (int n = 0; n < kSteps; ++n) {
            st.o[h][n][0] *= f0;
            st.o[h][n][1] *= f1;
            st.o[h][n][2] *= f0;
            st.o[h][n][3] *= f1;
          }
        }
      }

      // O^T += V^T P^T over k-steps of 16 tokens: P^T's B fragment (b[0] = P[head g][tokens 2t,
      // 2t+1]) is exactly what the S accumulators of this lane hold. Token rows past the chunk
      // (8-token chunks) give zero A (their P is 0, and 0 x a stale V could be NaN).
      auto v_word = [&](int row, int m, int half) {  // dims 32m + 4g + 2 half.. of token row r0 + row
        return *reinterpret_cast<const uint32_t*>(stage + v_off[m] + row * Shape::kRowVectors * 16 + 4 * half);
      };
      auto pack_p = [&](float x, float y) { return kVFp8 ? ptx::cvt_f16x2_f32(x, y) : pack_bf16x2(x, y); };
ATTN_UNROLL
      for (int kb = 0; kb < (kMaxTiles + 1) / 2; ++kb) {
        uint32_t b[kHeadTiles][2];
ATTN_UNROLL
        for (int h = 0; h < kHeadTiles; ++h) {
          b[h][0] = pack_p(s[2 * kb][2 * h], s[2 * kb][2 * h + 1]);
          b[h][1] = 2 * kb + 1 < kMaxTiles ? pack_p(s[2 * kb + 1][2 * h], s[2 * kb + 1][2 * h + 1]) : 0u;
        }
        // a[0], a[1]: token rows 16kb + 2t (+ 1); a[2], a[3]: 16kb + 2t + 8 (+ 1)
        // m-tile 2m + p: row g is dim 32m + 4g + 2p, row g + 8 dim 32m + 4g + 2p + 1.
ATTN_UNROLL
        for (int m = 0; m < kD / 32; ++m) {
          if (32 * m >= head_dim) break;
          // FP8: one word per row holds both p (bytes 2p, 2p + 1); bf16: word p of each row.
          uint32_t w[2][4];
ATTN_UNROLL
          for (int half = 0; half < (kVFp8 ? 1 : 2); ++half)
ATTN_UNROLL
            for (int r = 0; r < 4; ++r)  // rows r0 + 8 (+ 1) of an 8-token chunk are past it
              w[half][r] = 16 * kb + 8 * (r >> 1) < chunk ? v_word(16 * kb + (r & 1) + 8 * (r >> 1), m, half) : 0u;
ATTN_UNROLL
          for (int p = 0; p < 2; ++p) {
            uint32_t a[4];
            if constexpr (kVFp8) {  // bytes (2p, 2p + 1) of two token rows
              const uint32_t sel = p == 0 ? 0x5140u : 0x7362u;
              const uint32_t top = __byte_perm(w[0][0], w[0][1], sel), bottom = __byte_perm(w[0][2], w[0][3], sel);
              a[0] = ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(top & 0xffffu));
              a[1] = ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(top >> 16));
              a[2] = ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(bottom & 0xffffu));
              a[3] = ptx::cvt_f16x2_e4m3x2(static_cast<uint16_t>(bottom >> 16));
            } else {  // dims 2p, 2p + 1: low halves of two rows, then high halves
              a[0] = __byte_perm(w[p][0], w[p][1], 0x5410u);
              a[1] = __byte_perm(w[p][0], w[p][1], 0x7632u);
              a[2] = __byte_perm(w[p][2], w[p][3], 0x5410u);
              a[3] = __byte_perm(w[p][2], w[p][3], 0x7632u);
            }
ATTN_UNROLL
            for (int h = 0; h < kHeadTiles; ++h) {
              if constexpr (kVFp8) {
                ptx::mma_m16n8k16_f16(st.o[h][2 * m + p], a, b[h]);
              } else {
                ptx::mma_m16n8k16_bf16(st.o[h][2 * m + p], a, b[h]);
              }
            }
          }
        }
      }
      __syncwarp();  // the stage is rewritten next
    };

    stream_chunks(smem + warp * kWarpStageBytes, warp, num_chunks, issue, compute);
  }

  // Writes this warp's unnormalised output [kRows][kD] (in V's units), then m[kRows] and
  // l[kRows], to `mine`.
  ATTN_DEVICE void publish(State& st, float* mine) const {
    const int g = lane / 4, t = lane % 4;
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      st.l[h] += __shfl_xor_sync(kAllLanes, st.l[h], 1);
      st.l[h] += __shfl_xor_sync(kAllLanes, st.l[h], 2);
    }
    // O^T element e of m-tile 2m + p: dim 32m + 4g + 2p + e / 2, head 8h + 2t + e % 2.
ATTN_UNROLL
    for (int h = 0; h < kHeadTiles; ++h)
ATTN_UNROLL
      for (int n = 0; n < kSteps; ++n)
ATTN_UNROLL
        for (int e = 0; e < 4; ++e)
          mine[(8 * h + 2 * t + e % 2) * kD + 32 * (n / 2) + 4 * g + 2 * (n % 2) + e / 2] = st.o[h][n][e] * st.o_scale;
    if (t == 0) {
ATTN_UNROLL
      for (int h = 0; h < kHeadTiles; ++h) {
        mine[kRows * kD + g + 8 * h] = st.m[h];
        mine[kRows * kD + kRows + g + 8 * h] = st.l[h];
      }
    }
  }
};

}  // namespace

}  // namespace fp8serve::cuda::attn
