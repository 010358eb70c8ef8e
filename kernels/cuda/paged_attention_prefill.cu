// Prefill and chunked-prefill attention (sequences with two or more new tokens), tiled like
// FlashAttention-2 with the GQA group packed into the query tile.
//
// Work item = (sequence, KV head, query tile): Tq = 64 / group new tokens of the chunk times
// the group's query heads = up to 64 rows (row r: token r / group, head r % group), 16 rows per
// warp. The item walks the keys it may see, [0, its last token's position], in tiles of kBk keys
// (64, or 32 at head_dim 256; half as many for bf16 keys) from two segments when the bf16 window
// is on - the FP8 pool below fp8_lens[s] through the block table, the bf16 tail above it - with
// one online softmax over both (K scale on the scores of FP8 keys, V scale on their
// probabilities). Per tile, the CTA:
//   1. copies the raw tile (FP8 or bf16 bytes, K as stored [head_dim / P][keys][P]) into a
//      shared stage with 16-byte cp.async, two stages deep, the next tile in flight;
//   2. converts it to bf16 tiles K_s [keys][head_dim] and Vt_s [head_dim][keys] (exact: every
//      E4M3 value is a bf16 value; transient per tile, never a copy of the cache);
//   3. each warp computes S = Q K^T for its 16 rows, masks (causal within the chunk, segment
//      bounds), updates its online softmax (log2 domain, fp32) and accumulates P V in fp32.
// Step 3 has two implementations over the same tiles: bf16 mma.sync m16n8k16 with fp32
// accumulators (FA2's register reuse: the S accumulators become P's A fragments), and a SIMT
// version on CUDA cores (fp32 P), which the emulator runs; the emulator runs the MMA version too,
// with the MMA's fragment semantics emulated by shuffles (attention_device.cuh).
//
// Napkin math (Llama-3-8B shapes, FP8, 2k-token prefill): per KV head and tile of 64 rows x 64
// keys the tensor cores do 2 x 64 x 64 x 128 x 2 = 2.1 MFLOP against 16 KiB of FP8 K/V read
// (from L2 mostly: the tiles of one sequence re-read the same keys) - 128 FLOP per byte, so the
// kernel is bound by the MMA issue rate and the conversion pass, not by HBM. mma.sync reaches
// about 2/3 of Hopper's dense bf16 rate at best (wgmma would be the next step); the per-tile
// conversion and two barriers cost more. Shared memory at head_dim 128: 34 KiB of stages + 17 KiB
// K_s + 18 KiB Vt_s + 17 KiB Q = 86 KiB: two CTAs (8 warps) per SM.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_device.cuh"
#include "kernels/cuda/paged_attention_kernels.hpp"

namespace fp8serve::cuda::attn {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRowsPerWarp = 16;
constexpr int kTileRows = kWarps * kRowsPerWarp;  // 64
constexpr int kPad = 8;                           // bf16 elements of padding per smem row: no bank conflicts

template <int kD>
constexpr int key_tile() {
  return kD <= 128 ? 64 : 32;
}

// Shared memory: 2 raw stages [K: head_dim * kBk bytes | V: kBk rows of (head_dim + 16) bytes]
// | K_s [kBk][kD + kPad] | Vt_s [kD][kBk + kPad] | Q_s [64][kD + kPad] (bf16) | SIMT: S [warps][16]
// [kBk + 1] f32, row stats [warps][2][16] f32 | scan scratch [warps] | plan [num_seqs + 1].
struct PrefillSmem {
  int64_t stage_k_bytes, stage_bytes, stages, k_s, vt_s, q_s, s_s, stats, scratch, plan, total;
};
ATTN_HD PrefillSmem prefill_smem(int dim_pad, int bk, bool simt, int num_seqs) {
  PrefillSmem s{};
  s.stage_k_bytes = int64_t{dim_pad} * bk;
  s.stage_bytes = s.stage_k_bytes + int64_t{bk} * (dim_pad + 16);
  s.stages = 0;
  s.k_s = s.stages + 2 * s.stage_bytes;
  s.vt_s = s.k_s + int64_t{bk} * (dim_pad + kPad) * 2;
  s.q_s = s.vt_s + int64_t{dim_pad} * (bk + kPad) * 2;
  s.s_s = s.q_s + int64_t{kTileRows} * (dim_pad + kPad) * 2;
  s.stats = s.s_s + (simt ? int64_t{kWarps} * kRowsPerWarp * (bk + 1) * 4 : 0);
  s.scratch = s.stats + (simt ? int64_t{kWarps} * 2 * kRowsPerWarp * 4 : 0);
  s.plan = s.scratch + kWarps * 4;
  s.total = s.plan + (int64_t{num_seqs} + 1) * 4;
  return s;
}

// What the math of one tile needs to know about it.
struct TileInfo {
  int start;       // position of key 0
  int keys;        // keys in the tile: kBk (FP8) or kBk / 2 (bf16)
  int lo, hi;      // the segment's positions
  float score_scale, v_scale;
};

// What an item's rows are.
struct ItemRows {
  int first_pos;   // position of the tile's first token
  int group;
  int valid_rows;  // tokens in the tile x group
};

// Row `row` of the tile is token row / group: its position, the last key it sees.
ATTN_DEVICE int row_position(const ItemRows& rows, int row) { return rows.first_pos + row / rows.group; }

// Whether key `key` of the tile is in the segment and visible from a row at position row_pos.
ATTN_DEVICE bool key_visible(const TileInfo& t, int key, int row_pos) {
  const int pos = t.start + key;
  return key < t.keys && pos >= t.lo && pos < t.hi && pos <= row_pos;
}

// Tensor-core math of one warp's 16 rows (rows 16 warp + g and + 8 of the tile, g = lane / 4).
template <int kD, int kBk>
struct MmaMath {
  float o[kD / 8][4];
  float m[2], l[2];
  int row_pos[2];  // positions of this lane's rows

  ATTN_DEVICE void begin(const ItemRows& rows) {
ATTN_UNROLL
    for (int nb = 0; nb < kD / 8; ++nb)
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) o[nb][e] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
    const int row0 = static_cast<int>(threadIdx.x) / kWarp * kRowsPerWarp + static_cast<int>(threadIdx.x) % kWarp / 4;
    row_pos[0] = row_position(rows, row0);
    row_pos[1] = row_position(rows, row0 + 8);
  }

  ATTN_DEVICE void tile(const uint16_t* q_s, const uint16_t* k_s, const uint16_t* vt_s, const TileInfo& t,
                        int head_dim, float*, float*) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    const int g = lane / 4, c = lane % 4;
    const int r0 = warp * kRowsPerWarp + g;
    auto word = [](const uint16_t* base, int row, int stride, int col) {
      return *reinterpret_cast<const uint32_t*>(base + row * stride + col);
    };
    constexpr int kQStride = kD + kPad, kVStride = kBk + kPad;
    float s[kBk / 8][4];
ATTN_UNROLL
    for (int nb = 0; nb < kBk / 8; ++nb)
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) s[nb][e] = 0.0f;
ATTN_UNROLL
    for (int j = 0; j < kD / 16; ++j) {
      if (16 * j >= head_dim) break;
      const uint32_t a[4] = {word(q_s, r0, kQStride, 16 * j + 2 * c), word(q_s, r0 + 8, kQStride, 16 * j + 2 * c),
                             word(q_s, r0, kQStride, 16 * j + 8 + 2 * c),
                             word(q_s, r0 + 8, kQStride, 16 * j + 8 + 2 * c)};
ATTN_UNROLL
      for (int nb = 0; nb < kBk / 8; ++nb) {
        if (8 * nb >= t.keys) break;
        const uint32_t b[2] = {word(k_s, 8 * nb + g, kQStride, 16 * j + 2 * c),
                               word(k_s, 8 * nb + g, kQStride, 16 * j + 8 + 2 * c)};
        ptx::mma_m16n8k16_bf16(s[nb], a, b);
      }
    }
    // Scale, mask, online softmax; element e of s[nb] is row r0 (e < 2) or r0 + 8, key 8 nb + 2c + e % 2.
    float tile_max[2] = {-INFINITY, -INFINITY};
ATTN_UNROLL
    for (int nb = 0; nb < kBk / 8; ++nb)
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int key = 8 * nb + 2 * c + e % 2;
        const bool visible = key_visible(t, key, row_pos[e / 2]);
        s[nb][e] = visible ? s[nb][e] * t.score_scale : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[nb][e]);
      }
    float alpha[2];
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kAllLanes, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kAllLanes, tile_max[h], 2));
      const float m_new = fmaxf(m[h], tile_max[h]);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = exp2f(m[h] - m_use);
      m[h] = m_new;
      tile_max[h] = m_use;
    }
    float sum[2] = {0.0f, 0.0f};
ATTN_UNROLL
    for (int nb = 0; nb < kBk / 8; ++nb)
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = exp2f(s[nb][e] - tile_max[e / 2]);
        sum[e / 2] += s[nb][e];
      }
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) l[h] = l[h] * alpha[h] + sum[h];
ATTN_UNROLL
    for (int nb = 0; nb < kD / 8; ++nb)
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) o[nb][e] *= alpha[e / 2];
    // P V: the S accumulators of key blocks 2kb and 2kb + 1 are P's A fragment for keys 16kb..16kb+15.
ATTN_UNROLL
    for (int kb = 0; kb < kBk / 16; ++kb) {
      if (16 * kb >= t.keys) break;
      const uint32_t a[4] = {pack_bf16x2(s[2 * kb][0] * t.v_scale, s[2 * kb][1] * t.v_scale),
                             pack_bf16x2(s[2 * kb][2] * t.v_scale, s[2 * kb][3] * t.v_scale),
                             pack_bf16x2(s[2 * kb + 1][0] * t.v_scale, s[2 * kb + 1][1] * t.v_scale),
                             pack_bf16x2(s[2 * kb + 1][2] * t.v_scale, s[2 * kb + 1][3] * t.v_scale)};
ATTN_UNROLL
      for (int nb = 0; nb < kD / 8; ++nb) {
        if (8 * nb >= head_dim) break;
        const uint32_t b[2] = {word(vt_s, 8 * nb + g, kVStride, 16 * kb + 2 * c),
                               word(vt_s, 8 * nb + g, kVStride, 16 * kb + 8 + 2 * c)};
        ptx::mma_m16n8k16_bf16(o[nb], a, b);
      }
    }
  }

  // out(row): where the tile's row `row` (< valid_rows) goes, dims contiguous.
  template <class Out>
  ATTN_DEVICE void finish(const ItemRows& rows, int head_dim, float*, Out out) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    const int g = lane / 4, c = lane % 4;
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(kAllLanes, l[h], 1);
      l[h] += __shfl_xor_sync(kAllLanes, l[h], 2);
    }
ATTN_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int row = warp * kRowsPerWarp + g + 8 * h;
      if (row >= rows.valid_rows) continue;
      const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
      uint16_t* dst = out(row);
ATTN_UNROLL
      for (int nb = 0; nb < kD / 8; ++nb)
ATTN_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int d = 8 * nb + 2 * c + e;
          if (d < head_dim) dst[d] = bf16_encode(o[nb][2 * h + e] * inv);
        }
    }
  }
};

// The same tiles on CUDA cores: lane k scores keys k and k + 32 for all 16 rows, lanes 0..15 run
// the softmax of one row each, lane k accumulates dims k, k + 32, ... of all 16 rows (fp32 P).
template <int kD, int kBk>
struct SimtMath {
  float o[kRowsPerWarp][kD / kWarp];
  float m, l;  // of row `lane` (lanes 0..15)
  ItemRows rows;  // the rows' positions are computed when needed: at head_dim 256, 16 more
                  // registers of positions made ptxas spill

  ATTN_DEVICE void begin(const ItemRows& item_rows) {
ATTN_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r)
ATTN_UNROLL
      for (int i = 0; i < kD / kWarp; ++i) o[r][i] = 0.0f;
    rows = item_rows;
    m = -INFINITY;
    l = 0.0f;
  }

  ATTN_DEVICE void tile(const uint16_t* q_s, const uint16_t* k_s, const uint16_t* vt_s, const TileInfo& t,
                        int head_dim, float* s_s, float* stats) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    constexpr int kQStride = kD + kPad, kVStride = kBk + kPad, kSStride = kBk + 1;
    float* s_w = s_s + warp * kRowsPerWarp * kSStride;
    float* alpha_w = stats + warp * 2 * kRowsPerWarp;
    const uint16_t* q_w = q_s + warp * kRowsPerWarp * kQStride;
    for (int key = lane; key < kBk; key += kWarp) {
      if (key >= t.keys) continue;
      float acc[kRowsPerWarp] = {};
      for (int d = 0; d < head_dim; ++d) {
        const float k = bf16_bits_to_float(k_s[key * kQStride + d]);
ATTN_UNROLL
        for (int r = 0; r < kRowsPerWarp; ++r) acc[r] += bf16_bits_to_float(q_w[r * kQStride + d]) * k;
      }
ATTN_UNROLL
      for (int r = 0; r < kRowsPerWarp; ++r)
        s_w[r * kSStride + key] = key_visible(t, key, row_position(rows, warp * kRowsPerWarp + r))
                                      ? acc[r] * t.score_scale
                                      : -INFINITY;
    }
    __syncwarp();
    if (lane < kRowsPerWarp) {
      float* row = s_w + lane * kSStride;
      float tile_max = -INFINITY;
      for (int key = 0; key < t.keys; ++key) tile_max = fmaxf(tile_max, row[key]);
      const float m_new = fmaxf(m, tile_max);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m - m_use);
      float sum = 0.0f;
      for (int key = 0; key < t.keys; ++key) {
        const float p = exp2f(row[key] - m_use);
        sum += p;
        row[key] = p * t.v_scale;
      }
      l = l * alpha + sum;
      m = m_new;
      alpha_w[lane] = alpha;
    }
    __syncwarp();
ATTN_UNROLL
    for (int i = 0; i < kD / kWarp; ++i) {
      const int d = lane + kWarp * i;
      if (d >= head_dim) continue;
      const uint16_t* v_row = vt_s + d * kVStride;
ATTN_UNROLL
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float acc = o[r][i] * alpha_w[r];
        for (int key = 0; key < t.keys; ++key) acc += s_w[r * kSStride + key] * bf16_bits_to_float(v_row[key]);
        o[r][i] = acc;
      }
    }
    __syncwarp();  // s_w and alpha_w are rewritten by the next tile
  }

  template <class Out>
  ATTN_DEVICE void finish(const ItemRows& rows, int head_dim, float* stats, Out out) {
    const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
    float* l_w = stats + warp * 2 * kRowsPerWarp + kRowsPerWarp;
    if (lane < kRowsPerWarp) l_w[lane] = l;
    __syncwarp();
ATTN_UNROLL
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      if (row >= rows.valid_rows) continue;
      const float inv = l_w[r] > 0.0f ? 1.0f / l_w[r] : 0.0f;
      uint16_t* dst = out(row);
ATTN_UNROLL
      for (int i = 0; i < kD / kWarp; ++i) {
        const int d = lane + kWarp * i;
        if (d < head_dim) dst[d] = bf16_encode(o[r][i] * inv);
      }
    }
    __syncwarp();
  }
};

template <int kD, bool kMma>
struct PrefillCta {
  static constexpr int kBk = key_tile<kD>();
  using Math = std::conditional_t<kMma, MmaMath<kD, kBk>, SimtMath<kD, kBk>>;

  const AttentionArgs& args;
  unsigned char* smem;
  PrefillSmem layout;
  int tid;

  // Keys per tile of a segment: kBk when K and V are FP8, half as many when either is bf16, so
  // that a tile's raw bytes fit one stage.
  static ATTN_DEVICE int tile_keys(const KeySegment& seg) { return seg.k_fp8 && seg.v_fp8 ? kBk : kBk / 2; }

  // Copies tile `tile` of the segment (positions [tile * keys, + keys)) into raw stage `stage`.
  // Sizes that vary at run time are powers of two (keys, block_size): shifts, not divisions.
  ATTN_DEVICE void issue(const KeySegment& seg, int tile, int key_shift, int stage) {
    const int block_size = args.cache.block_size, block_shift = log2_of(block_size);
    const int head_dim = args.head_dim;
    unsigned char* raw = smem + layout.stages + stage * layout.stage_bytes;
    const int start = tile << key_shift;
    const int quad_shift = key_shift - 2;
    const int k_vectors = head_dim >> (seg.k_fp8 ? 2 : 1) << quad_shift;  // word columns x quads of keys
    for (int v = tid; v < k_vectors; v += kThreads) {
      const int group = v >> quad_shift, key = (v & ((1 << quad_shift) - 1)) * 4;
      const int pos = start + key;
      bool ok = pos + 3 >= seg.lo && pos < seg.hi;  // the 4 keys' words of one column
      const unsigned char* block = ok ? seg.k.block(pos >> block_shift, ok) : seg.k.base;
      ptx::cp_async_cg16(raw + ((group << key_shift) + key) * 4,
                   block + ((int64_t{group} << block_shift) + (pos & (block_size - 1))) * 4, ok ? 16 : 0);
    }
    // V rows are staged kD elements (+ 16 bytes against bank conflicts) apart.
    const int v_elem = seg.v_fp8 ? 1 : 2;
    const int row_vectors = head_dim * v_elem / 16;
    const int padded_shift = log2_of(kD * v_elem / 16);
    for (int v = tid; v < (1 << (key_shift + padded_shift)); v += kThreads) {
      const int key = v >> padded_shift, part = v & ((1 << padded_shift) - 1);
      if (part >= row_vectors) continue;
      const int pos = start + key;
      bool ok = pos >= seg.lo && pos < seg.hi;
      const unsigned char* block = ok ? seg.v.block(pos >> block_shift, ok) : seg.v.base;
      ptx::cp_async_cg16(raw + layout.stage_k_bytes + key * (kD * v_elem + 16) + part * 16,
                   block + (pos & (block_size - 1)) * seg.v.row_bytes + part * 16, ok ? 16 : 0);
    }
  }

  // Raw stage -> K_s [key][dim] and Vt_s [dim][key] in bf16 (keys outside the segment: zeros).
  ATTN_DEVICE void convert(const KeySegment& seg, int tile, int key_shift, int stage) {
    const int head_dim = args.head_dim;
    const unsigned char* raw = smem + layout.stages + stage * layout.stage_bytes;
    uint16_t* k_s = reinterpret_cast<uint16_t*>(smem + layout.k_s);
    uint16_t* vt_s = reinterpret_cast<uint16_t*>(smem + layout.vt_s);
    const int keys = 1 << key_shift;
    const int start = tile << key_shift;
    const int columns = head_dim / 4;  // 4-dim columns
    // K: consecutive threads take consecutive keys of one 4-dim column (conflict-free reads).
    for (int i = tid; i < keys * columns; i += kThreads) {
      const int key = i & (keys - 1), col = i >> key_shift;
      const int pos = start + key;
      uint32_t lo = 0, hi = 0;
      if (pos >= seg.lo && pos < seg.hi) {
        if (seg.k_fp8) {
          float x[4];
          fp8x4_to_float(*reinterpret_cast<const uint32_t*>(raw + ((col << key_shift) + key) * 4), x);
          lo = pack_bf16x2(x[0], x[1]);  // exact: E4M3 values are bf16 values
          hi = pack_bf16x2(x[2], x[3]);
        } else {
          lo = *reinterpret_cast<const uint32_t*>(raw + ((2 * col << key_shift) + key) * 4);
          hi = *reinterpret_cast<const uint32_t*>(raw + (((2 * col + 1) << key_shift) + key) * 4);
        }
      }
      *reinterpret_cast<uint2*>(k_s + key * (kD + kPad) + 4 * col) = make_uint2(lo, hi);
    }
    // V: a warp takes 8 keys x 4 columns, so the padded raw rows and the transposed writes
    // spread over the banks.
    const int raw_row = kD * (seg.v_fp8 ? 1 : 2) + 16;
    const int key_octets_shift = key_shift - 3;
    for (int i = tid; i < keys * columns; i += kThreads) {
      const int key = ((i >> 5) & ((1 << key_octets_shift) - 1)) * 8 + (i & 7);
      const int col = (i >> (5 + key_octets_shift)) * 4 + ((i >> 3) & 3);
      const int pos = start + key;
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (pos >= seg.lo && pos < seg.hi) {
        const unsigned char* src = raw + layout.stage_k_bytes + key * raw_row;
        if (seg.v_fp8) {
          fp8x4_to_float(*reinterpret_cast<const uint32_t*>(src + 4 * col), x);
        } else {
          const uint2 pair = *reinterpret_cast<const uint2*>(src + 8 * col);
          x[0] = bf16_lo(pair.x);
          x[1] = bf16_hi(pair.x);
          x[2] = bf16_lo(pair.y);
          x[3] = bf16_hi(pair.y);
        }
      }
ATTN_UNROLL
      for (int e = 0; e < 4; ++e) vt_s[(4 * col + e) * (kBk + kPad) + key] = bf16_encode(x[e]);
    }
  }

  // All tiles of one segment through the two stages.
  ATTN_DEVICE void run_segment(const KeySegment& seg, Math& math) {
    const int keys = tile_keys(seg), key_shift = log2_of(keys);
    const int first = seg.lo >> key_shift;
    const int count = ((seg.hi + keys - 1) >> key_shift) - first;
    const uint16_t* q_s = reinterpret_cast<const uint16_t*>(smem + layout.q_s);
    const uint16_t* k_s = reinterpret_cast<const uint16_t*>(smem + layout.k_s);
    const uint16_t* vt_s = reinterpret_cast<const uint16_t*>(smem + layout.vt_s);
    float* s_s = reinterpret_cast<float*>(smem + layout.s_s);
    float* stats = reinterpret_cast<float*>(smem + layout.stats);
    issue(seg, first, key_shift, 0);
    ptx::cp_async_commit();
    for (int i = 0; i < count; ++i) {
      if (i + 1 < count) issue(seg, first + i + 1, key_shift, (i + 1) % 2);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
      __syncthreads();  // tile i has landed for every thread; the math of tile i - 1 is done
      convert(seg, first + i, key_shift, i % 2);
      __syncthreads();
      const TileInfo t{(first + i) * keys, keys, seg.lo, seg.hi, args.qk_scale * seg.k_scale, seg.v_scale};
      math.tile(q_s, k_s, vt_s, t, args.head_dim, s_s, stats);
    }
    ptx::cp_async_wait<0>();
  }
};

ATTN_DEVICE int num_new(const PagedBatch& b, int s) { return b.query_start_loc[s + 1] - b.query_start_loc[s]; }

template <int kD, bool kMma>
__global__ void __launch_bounds__(kThreads) paged_prefill_kernel(AttentionArgs args) {
  FP8SERVE_DYNAMIC_SHARED(unsigned char, smem);
  using Cta = PrefillCta<kD, kMma>;
  const PagedBatch& batch = args.batch;
  const int n = batch.num_seqs;
  const int tid = static_cast<int>(threadIdx.x);
  const int group = args.group, head_dim = args.head_dim;
  const int tile_tokens = kTileRows / group;
  const int kv_heads = args.cache.num_kv_heads;
  const PrefillSmem layout = prefill_smem(kD, Cta::kBk, !kMma, n);
  int* scratch = reinterpret_cast<int*>(smem + layout.scratch);
  int* plan = reinterpret_cast<int*>(smem + layout.plan);
  uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + layout.q_s);

  block_exclusive_scan(
      n, kThreads,
      [&](int s) {
        const int new_tokens = num_new(batch, s);
        return new_tokens >= 2 ? (new_tokens + tile_tokens - 1) / tile_tokens * kv_heads : 0;
      },
      plan, scratch);

  Cta cta{args, smem, layout, tid};
  // plan[n] (the item count) is read from shared memory each time rather than kept in a register
  // across the item's work, which pushed it to local memory (a spill) in some instantiations.
  for (int item = static_cast<int>(blockIdx.x); item < plan[n]; item += static_cast<int>(gridDim.x)) {
    const int s = find_owner(plan, n, item);
    const int local = item - plan[s];
    const int new_tokens = num_new(batch, s);
    const int num_tiles = (new_tokens + tile_tokens - 1) / tile_tokens;
    const int tile = num_tiles - 1 - local / kv_heads;  // the sequence's longest tiles first
    const int kv_head = local % kv_heads;
    const int context = min(batch.context_lens[s], batch.max_blocks_per_seq * args.cache.block_size);
    const int tokens = min(tile_tokens, new_tokens - tile * tile_tokens);
    const int first_token = batch.query_start_loc[s] + tile * tile_tokens;
    ItemRows rows{};
    rows.first_pos = batch.context_lens[s] - new_tokens + tile * tile_tokens;
    rows.group = group;
    rows.valid_rows = tokens * group;
    const int key_end = min(context, rows.first_pos + tokens);  // keys [0, the last token's position]

    // Q rows: warp w takes rows w, w + 4, ...; its lanes take the dims (coalesced).
    for (int r = tid / kWarp; r < kTileRows; r += kWarps) {
      const bool valid = r < rows.valid_rows;
      const uint16_t* src = args.q + (first_token + (valid ? r / group : 0)) * args.q_token_stride +
                            int64_t{kv_head * group + (valid ? r % group : 0)} * head_dim;
      for (int d = tid % kWarp; d < kD; d += kWarp) q_s[r * (kD + kPad) + d] = valid && d < head_dim ? src[d] : 0;
    }
    __syncthreads();

    typename Cta::Math math;
    math.begin(rows);
    for (int part = 0; part < 2; ++part) {  // the main pool's keys, then the bf16 tail's: one softmax
      const KeySegment keys = segment(args.cache, args.tail, batch, s, kv_head, 0, key_end, part == 1);
      if (keys.hi > keys.lo) cta.run_segment(keys, math);
    }
    math.finish(rows, head_dim, reinterpret_cast<float*>(smem + layout.stats), [&](int row) {
      return args.out + (first_token + row / group) * args.out_token_stride +
             int64_t{kv_head * group + row % group} * head_dim;
    });
    __syncthreads();  // q_s, K_s and Vt_s are rewritten by the next item
  }
}

template <int kD, bool kMma>
void launch_prefill_for(const AttentionArgs& args, int32_t sms, cudaStream_t stream) {
  const std::size_t shared =
      static_cast<std::size_t>(prefill_smem(kD, key_tile<kD>(), !kMma, args.batch.num_seqs).total);
  const int32_t grid = persistent_grid(paged_prefill_kernel<kD, kMma>, kThreads, shared, sms);
  FP8SERVE_LAUNCH((paged_prefill_kernel<kD, kMma>), dim3(static_cast<unsigned>(grid)), dim3(kThreads), shared, stream,
                  args);
  CUDA_CHECK(cudaGetLastError());
}

template <bool kMma>
void launch_prefill_math(const AttentionArgs& args, int32_t sms, cudaStream_t stream) {
  switch (padded_head_dim(args.head_dim)) {
    case 32: return launch_prefill_for<32, kMma>(args, sms, stream);
    case 64: return launch_prefill_for<64, kMma>(args, sms, stream);
    case 128: return launch_prefill_for<128, kMma>(args, sms, stream);
    default: return launch_prefill_for<256, kMma>(args, sms, stream);
  }
}

}  // namespace

void launch_prefill(const AttentionArgs& args, PagedAttentionCudaOptions::PrefillMath math, int32_t sms,
                    cudaStream_t stream) {
  using Math = PagedAttentionCudaOptions::PrefillMath;
  const bool mma = math != Math::simt;
  if (mma) {
    launch_prefill_math<true>(args, sms, stream);
  } else {
    launch_prefill_math<false>(args, sms, stream);
  }
}

}  // namespace fp8serve::cuda::attn
