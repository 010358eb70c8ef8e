// The body of one CPU paged-attention work item, written once against a vector type V and the
// pool's element type T (uint8_t = FP8 E4M3, uint16_t = bf16). Not a normal header: each of
// attention_tile_{scalar,avx2,avx512}.cpp defines its V inside its target region (an anonymous
// namespace, so the instantiations never collide) and then includes this file there. It
// includes nothing itself, so that no standard header is compiled under a wider target; the
// including file provides <algorithm>, <cmath>, <cstdint>, <limits>, <type_traits> and
// attention_item.hpp.
//
// V provides: Reg, W (lanes), kNumRegs (vector registers), zero, set1, load, store, mul,
// fma(a, b, c) = a * b + c, reduce_add, reduce_max, max, exp2 (exp2(-inf) = 0); load_kv for W
// elements of a V row, uint8_t (FP8 E4M3 -> fp32 in registers, times 1 / kFp8Unit, a power of
// two folded into the scales) or uint16_t (bf16 -> fp32); and load_k_group for W keys' 4-byte
// group of K (kKPack<T> elements each, see kernels/paged_kv.hpp) as kKPack<T> vectors of W
// lanes, one per element, converted the same way; lanes >= `lanes` are never read.
//
// Optionally V also provides its own bf16 dot-product kernels (kDotBf16 = true; see
// attention_tile_avx512bf16.cpp): then K, V, q and the probabilities enter the dot products as
// bf16 (exact for K and V, rounded for q and p), the output columns sit in o in V::o_slot<T>'s
// order, and V::kMaxRows caps the query rows per pass.
//
// Algorithm: flash attention on the CPU. Up to kMaxRows query rows (tokens x heads of one GQA
// group) share every K and V row loaded from the pool, so each block's bytes are converted in
// registers once per row set and never stored dequantized. Scores are kept in the log2 domain
// (q pre-multiplied by softmax_scale * k_scale * log2(e)), so the softmax is exp2.

namespace fp8serve::cpu {
namespace tile {

constexpr int kMaxRows = 8;    // query rows against one K/V load: 8 accumulators fit AVX2's regs
constexpr float kLog2e = 1.4426950408889634f;

template <class V>
constexpr bool kDotBf16 = requires { requires V::kDotBf16; };

template <class V>
constexpr int rows_per_pass() {
  if constexpr (requires { V::kMaxRows; }) return V::kMaxRows;
  else return kMaxRows;
}

// The next block's K tile and V rows of one head, prefetched a few rows' worth (head_dim
// elements of each) at a time while the current chunk's keys are scored: advance(done, total)
// tops the prefetched rows up to the fraction done / total of the block. Blocks sit anywhere
// in the pool, so the hardware prefetcher sees a new short stream at every block; asking for
// the next one early hides it. Measured on Zen 4 (16384 x 8, two threads, medians of
// interleaved runs): into L2 (prefetcht1) rather than L1, FP8 22.6 -> 18.9 ms and bf16 35.1 ->
// 31.5 ms; spread over the chunk rather than all 64 lines at its start (where the burst stalled
// on the miss buffers: ~150 of ~1300 cycles per chunk), 20.3 -> 16.7 ms and 36.7 -> 26.5 ms.
// Default-constructed: nothing to prefetch.
class NextBlockPrefetch {
 public:
  NextBlockPrefetch() = default;
  // k: the block's K tile (contiguous, rows of k_row_bytes); v: its first V row, rows
  // v_row_stride bytes apart.
  NextBlockPrefetch(const void* k, int k_row_bytes, const void* v, int64_t v_row_stride, int v_row_bytes, int rows)
      : k_(static_cast<const char*>(k)), v_(static_cast<const char*>(v)), rows_(rows), k_row_bytes_(k_row_bytes),
        v_row_bytes_(v_row_bytes), v_row_stride_(v_row_stride) {}
  void advance(int done, int total) {
    for (; next_ * total < rows_ * done; ++next_) {  // next_ < ceil(rows_ * done / total), no division
      const char* k_row = k_ + next_ * k_row_bytes_;  // the tile is contiguous
      const char* v_row = v_ + next_ * v_row_stride_;
      for (int b = 0; b < k_row_bytes_; b += 64) __builtin_prefetch(k_row + b, 0, 2);
      for (int b = 0; b < v_row_bytes_; b += 64) __builtin_prefetch(v_row + b, 0, 2);
    }
  }

 private:
  const char* k_ = nullptr;
  const char* v_ = nullptr;
  int rows_ = 0;  // 0: no next block
  int next_ = 0;
  int k_row_bytes_ = 0;
  int v_row_bytes_ = 0;
  int64_t v_row_stride_ = 0;
};

// s[r][j] = q[r] . k[j] for the chunk's keys j in [0, nj_padded), with keys in vector lanes:
// k points at the chunk's first key in its block's K tile, where element g * P + i of key j sits
// at k + g * group_stride + j * P + i (P = kKPack<T>). lanes_left keys remain in the block from
// there: lanes past them are not read (0); keys in [nj, lanes_left) hold whatever the block
// holds, finite or not, and are masked by the caller. Each row's score vector needs no
// reduction across lanes. Two accumulators per row, element i of each K group into acc[i % 2],
// then acc[0] + acc[1]: a fixed order whatever the number of rows in the pass, so a row's scores
// - and so its output - are bitwise the same in a decode (the GQA group's rows) and in a prefill
// tile (8 rows), which preemption's recompute and batch invariance rely on. (It was
// min(P, 8 / rows) accumulators: a prefill row then summed in another order than its decode.)
template <class V, class T, int NR>
void score_keys(const float (*q)[kMaxHeadDim], const T* k, int64_t group_stride, int lanes_left,
                int head_dim, int nj_padded, float (*s)[kKeyChunk], NextBlockPrefetch& next) {
  using Reg = typename V::Reg;
  constexpr int P = kKPack<T>;
  constexpr int A = 2;
  static_assert(P % A == 0, "a K group's elements alternate between the two accumulators");
  const int groups = head_dim / P;
  const int passes = nj_padded / V::W;
  for (int pass = 0; pass < passes; ++pass) {
    const int j0 = pass * V::W;
    const int lanes = std::min(V::W, lanes_left - j0);
    Reg acc[A][NR];
#pragma GCC unroll 4
    for (int a = 0; a < A; ++a)
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) acc[a][r] = V::zero();
    for (int g = 0; g < groups; ++g) {
      next.advance(pass * groups + g + 1, passes * groups);
      Reg kk[P];
      V::load_k_group(k + g * group_stride + j0 * P, lanes, kk);
#pragma GCC unroll 4
      for (int i = 0; i < P; ++i)
#pragma GCC unroll 8
        for (int r = 0; r < NR; ++r) acc[i % A][r] = V::fma(V::set1(q[r][g * P + i]), kk[i], acc[i % A][r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
      for (int a = 1; a < A; ++a) acc[0][r] = V::add(acc[0][r], acc[a][r]);
      V::store(s[r] + j0, acc[0][r]);
    }
  }
}

// o[r] = o[r] * alpha[r] + sum_j p[r][j] v[j]. CU column vectors at once keep CU * NR
// independent FMA chains in flight.
template <class V, class T, int NR, int CU>
void accumulate_values(const float (*p)[kKeyChunk], const float* alpha, const T* v,
                       int64_t v_token_stride, int head_dim, int nj, float (*o)[kMaxHeadDim]) {
  using Reg = typename V::Reg;
  int c = 0;
  for (; c + CU * V::W <= head_dim; c += CU * V::W) {
    Reg acc[CU][NR];
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      const Reg a = V::set1(alpha[r]);
#pragma GCC unroll 8
      for (int u = 0; u < CU; ++u) acc[u][r] = V::mul(V::load(o[r] + c + u * V::W), a);
    }
    for (int j = 0; j < nj; ++j) {
      Reg vv[CU];
#pragma GCC unroll 8
      for (int u = 0; u < CU; ++u) vv[u] = V::load_kv(v + j * v_token_stride + c + u * V::W);
#pragma GCC unroll 8
      for (int r = 0; r < NR; ++r) {
        const Reg pr = V::set1(p[r][j]);
#pragma GCC unroll 8
        for (int u = 0; u < CU; ++u) acc[u][r] = V::fma(pr, vv[u], acc[u][r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < CU; ++u) V::store(o[r] + c + u * V::W, acc[u][r]);
  }
  if constexpr (CU > 1) {
    if (c < head_dim) {
      // The leftover columns: shift every row pointer by c and run the one-vector variant.
      float (*o_tail)[kMaxHeadDim] = reinterpret_cast<float (*)[kMaxHeadDim]>(&o[0][c]);
      accumulate_values<V, T, NR, 1>(p, alpha, v + c, v_token_stride, head_dim - c, nj, o_tail);
    }
  }
}

// Where a column of the value accumulators sits in o when the values are of type T.
template <class V, class T>
int o_slot(int d) {
  if constexpr (kDotBf16<V>) return V::template o_slot<T>(d);
  else return d;
}

// The running state of NR query rows: what flash attention carries from one key chunk to the
// next, whichever segment (FP8 body, bf16 tail) the keys come from.
template <class V, int NR>
struct Rows {
  alignas(64) float q[NR][kMaxHeadDim];  // q times its segment's scales and log2(e)
  alignas(64) float o[NR][kMaxHeadDim];  // sum p v, columns in o_slot order
  alignas(64) float s[NR][kKeyChunk];    // scores, then probabilities
  alignas(64) uint16_t q_bf16[kDotBf16<V> ? NR : 1][kMaxHeadDim];  // q in bf16, for kDotBf16
  float m[NR], alpha[NR];
  typename V::Reg l[NR];  // per-lane partial sums of the row's probabilities, added across at the end
  int pos[NR];
};

// q of rows [row0, row0 + NR) times the segment's score scale and log2(e).
template <class V, int NR>
void load_q(const AttentionItem& it, int row0, float scale, Rows<V, NR>& st) {
  const float mul = scale * kLog2e;
  for (int r = 0; r < NR; ++r) {
    const int token = (row0 + r) / it.group;
    const int head = (row0 + r) % it.group;
    const float* src = it.q + token * it.q_token_stride + static_cast<int64_t>(head) * it.head_dim;
    for (int d = 0; d < it.head_dim; ++d) st.q[r][d] = src[d] * mul;
  }
  if constexpr (kDotBf16<V>) {
    for (int r = 0; r < NR; ++r) V::prepare_q(st.q[r], it.head_dim, st.q_bf16[r]);
  }
}

// Logical block b -> physical block of one pool: the sequence's block table, or its tail ring.
struct BlockMap {
  const int32_t* table = nullptr;  // null: the ring
  int32_t ring_first = 0;
  int32_t ring_blocks = 1;
  int64_t operator()(int b) const { return table != nullptr ? table[b] : ring_first + b % ring_blocks; }
};

// Where a segment's keys (elements TK) and values (TV) live.
struct Segment {
  const void* k = nullptr;
  const void* v = nullptr;
  BlockMap k_blocks, v_blocks;
  int64_t k_block_stride = 0, v_block_stride = 0, v_token_stride = 0;
};

// The online softmax over keys [key_begin, key_end) of one segment, continuing the rows' state.
template <class V, class TK, class TV, int NR>
void attend_keys(const AttentionItem& it, const Segment& seg, int key_begin, int key_end, Rows<V, NR>& st) {
  using Reg = typename V::Reg;
  // 4 x 4 value accumulators fit AVX-512's 32 registers, not AVX2's 16.
  constexpr int CU = NR <= 2 || (NR <= 4 && V::kNumRegs >= 32) ? 4 : (NR <= 4 ? 2 : 1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int head_dim = it.head_dim;
  const TK* k_base = static_cast<const TK*>(seg.k);
  const TV* v_base = static_cast<const TV*>(seg.v);
  const int64_t k_group_stride = int64_t{it.block_size} * kKPack<TK>;  // between a block's K groups
  for (int key = key_begin; key < key_end;) {
    const int block = key / it.block_size;
    const int in_block = key - block * it.block_size;
    const int nj = std::min({kKeyChunk, it.block_size - in_block, key_end - key});
    const TK* k_chunk = k_base + seg.k_blocks(block) * seg.k_block_stride + in_block * kKPack<TK>;
    const TV* v_chunk = v_base + seg.v_blocks(block) * seg.v_block_stride + in_block * seg.v_token_stride;
    NextBlockPrefetch next;
    if (in_block + nj == it.block_size && key + nj < key_end) {
      next = NextBlockPrefetch(k_base + seg.k_blocks(block + 1) * seg.k_block_stride, head_dim * int{sizeof(TK)},
                               v_base + seg.v_blocks(block + 1) * seg.v_block_stride,
                               seg.v_token_stride * int64_t{sizeof(TV)}, head_dim * int{sizeof(TV)}, it.block_size);
    }
    const int nj_padded = (nj + V::W - 1) / V::W * V::W;
    const int lanes_left = it.block_size - in_block;
    if constexpr (kDotBf16<V>) {
      V::template score_keys<TK, NR>(st.q_bf16, k_chunk, k_group_stride, lanes_left, head_dim, nj_padded, st.s, next);
    } else {
      score_keys<V, TK, NR>(st.q, k_chunk, k_group_stride, lanes_left, head_dim, nj_padded, st.s, next);
    }

    // Online softmax update per row; keys past a row's position (causal) get probability 0.
    for (int r = 0; r < NR; ++r) {
      float* s = st.s[r];
      const int visible = std::max(0, std::min(nj, st.pos[r] - key + 1));
      for (int j = visible; j < nj_padded; ++j) s[j] = kNegInf;
      if (visible == 0) {
        st.alpha[r] = 1.0f;
        for (int j = 0; j < nj_padded; ++j) s[j] = 0.0f;
        continue;
      }
      Reg vmax = V::set1(kNegInf);
      for (int j = 0; j < nj_padded; j += V::W) vmax = V::max(vmax, V::load(s + j));
      const float m_new = std::max(st.m[r], V::reduce_max(vmax));
      // exp2(-inf) = 0 on the row's first keys; an unchanged max (the common case once the
      // largest scores are behind) needs no exp2.
      st.alpha[r] = m_new == st.m[r] ? 1.0f : std::exp2(st.m[r] - m_new);
      Reg vsum = V::zero();
      for (int j = 0; j < nj_padded; j += V::W) {
        const Reg p = V::exp2(V::add(V::load(s + j), V::set1(-m_new)));
        V::store(s + j, p);
        vsum = V::add(vsum, p);
      }
      st.l[r] = V::fma(st.l[r], V::set1(st.alpha[r]), vsum);
      st.m[r] = m_new;
    }
    if constexpr (kDotBf16<V>) {
      V::template accumulate_values<TV, NR>(st.s, st.alpha, v_chunk, seg.v_token_stride, head_dim, nj, st.o);
    } else {
      accumulate_values<V, TV, NR, CU>(st.s, st.alpha, v_chunk, seg.v_token_stride, head_dim, nj, st.o);
    }
    key += nj;
  }
}

// The FP8 values' sums become the values' own units (times `mul` = v_scale times what load_kv
// under-reports by), their columns moved from FP8's accumulator order to bf16's: where the FP8
// body meets a bf16 V tail.
template <class V, int NR>
void fp8_sums_to_bf16(int head_dim, float mul, Rows<V, NR>& st) {
  if constexpr (!kDotBf16<V>) {  // one column order: scale in place
    for (int r = 0; r < NR; ++r)
      for (int d = 0; d < head_dim; ++d) st.o[r][d] *= mul;
  } else {
    int from[kMaxHeadDim], to[kMaxHeadDim];
    for (int d = 0; d < head_dim; ++d) {
      from[d] = o_slot<V, uint8_t>(d);
      to[d] = o_slot<V, uint16_t>(d);
    }
    alignas(64) float row[kMaxHeadDim];
    for (int r = 0; r < NR; ++r) {
      for (int d = 0; d < head_dim; ++d) row[d] = st.o[r][from[d]];
      for (int d = 0; d < head_dim; ++d) st.o[r][to[d]] = row[d] * mul;
    }
  }
}

// The rows' results (attention_item.hpp): o holds sums of values of type TV times `unit`
// (what load_kv under-reports by, 1 for exact values) and, final, times v_scale.
template <class V, class TV, int NR>
void store_rows(const AttentionItem& it, int row0, float unit, float v_scale, Rows<V, NR>& st) {
  const int head_dim = it.head_dim;
  for (int r = 0; r < NR; ++r) {
    const int row = row0 + r;
    const float l_row = V::reduce_add(st.l[r]);
    if (it.m == nullptr) {
      const int token = row / it.group;
      const int head = row % it.group;
      float* dst = it.out + token * it.out_token_stride + static_cast<int64_t>(head) * head_dim;
      const float mul = v_scale * unit / l_row;  // >= 1: the max key contributes exp2(0)
      for (int d = 0; d < head_dim; ++d) dst[d] = st.o[r][o_slot<V, TV>(d)] * mul;
    } else {
      float* dst = it.out + static_cast<int64_t>(row) * head_dim;
      for (int d = 0; d < head_dim; ++d) dst[d] = st.o[r][o_slot<V, TV>(d)] * unit;
      it.m[row] = st.m[r];
      it.l[row] = l_row;
    }
  }
}

// Rows [row0, row0 + NR) of the item, processed to the end of its key partition: the pool's
// keys below tail_begin, then (a window) the tail's, through one online softmax.
template <class V, class T, int NR>
void attend_rows(const AttentionItem& it, int row0) {
  Rows<V, NR> st;
  for (int r = 0; r < NR; ++r) {
    for (int d = 0; d < it.head_dim; ++d) st.o[r][d] = 0.0f;
    st.m[r] = -std::numeric_limits<float>::infinity();
    st.l[r] = V::zero();
    st.pos[r] = it.first_pos + (row0 + r) / it.group;
  }
  // What load_kv under-reports by (a power of two: folding it in changes no rounding).
  constexpr float unit = std::is_same_v<T, uint8_t> ? V::kFp8Unit : 1.0f;
  const int key_end = std::min(it.key_end, st.pos[NR - 1] + 1);  // rows are in position order
  Segment pool;
  pool.k = it.k;
  pool.v = it.v;
  pool.k_blocks.table = pool.v_blocks.table = it.block_table;
  pool.k_block_stride = pool.v_block_stride = it.block_stride;
  pool.v_token_stride = it.v_token_stride;
  const bool window = std::is_same_v<T, uint8_t> && it.tail_k != nullptr;
  // With a bf16 V tail, an item whose keys reach the tail gives its rows in the values' own units
  // (attention_item.hpp); the others, the FP8 body's partitions, stay as without a window.
  const bool exact_values = window && it.tail_v != nullptr && it.key_end > it.tail_begin;
  const int split = window ? std::clamp(it.tail_begin, it.key_begin, std::max(it.key_begin, key_end)) : key_end;
  if (it.key_begin < split) {
    load_q(it, row0, it.qk_scale * unit, st);
    attend_keys<V, T, T, NR>(it, pool, it.key_begin, split, st);
  }
  if constexpr (std::is_same_v<T, uint8_t>) {
    if (window) {
      Segment tail = pool;  // V stays the pool's in a K-only window
      tail.k = it.tail_k;
      tail.k_blocks = BlockMap{nullptr, it.tail_first_block, it.tail_ring_blocks};
      tail.k_block_stride = it.tail_block_stride;
      if (split < key_end) load_q(it, row0, it.tail_qk_scale, st);
      if (exact_values) {
        tail.v = it.tail_v;
        tail.v_blocks = tail.k_blocks;
        tail.v_block_stride = it.tail_block_stride;
        tail.v_token_stride = it.tail_v_token_stride;
        fp8_sums_to_bf16(it.head_dim, it.v_scale * unit, st);
        if (split < key_end) attend_keys<V, uint16_t, uint16_t, NR>(it, tail, split, key_end, st);
        return store_rows<V, uint16_t, NR>(it, row0, 1.0f, 1.0f, st);
      }
      if (split < key_end) attend_keys<V, uint16_t, uint8_t, NR>(it, tail, split, key_end, st);
    }
  }
  store_rows<V, T, NR>(it, row0, unit, it.v_scale, st);
}

// Rows [row0, row0 + n) for n <= NR, with the row count as a template argument.
template <class V, class T, int NR>
void attend_rows_upto(const AttentionItem& it, int row0, int n) {
  if constexpr (NR > 1) {
    if (n < NR) return attend_rows_upto<V, T, NR - 1>(it, row0, n);
  }
  attend_rows<V, T, NR>(it, row0);
}

template <class V, class T>
void attend_item(const AttentionItem& it) {
  constexpr int kRows = rows_per_pass<V>();
  const int rows = it.num_q_tokens * it.group;
  for (int row0 = 0; row0 < rows; row0 += kRows) {
    attend_rows_upto<V, T, kRows>(it, row0, std::min(kRows, rows - row0));
  }
}

template <class V>
void attend_item_dispatch(const AttentionItem& it) {
  switch (it.dtype) {
    case KvDtype::fp8_e4m3: attend_item<V, uint8_t>(it); break;
    case KvDtype::bf16: attend_item<V, uint16_t>(it); break;
  }
}

}  // namespace tile
}  // namespace fp8serve::cpu
