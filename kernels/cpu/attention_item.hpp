#pragma once
// One work item of the CPU paged attention: the query rows of one (sequence, KV head, query
// tile) against one partition of that sequence's keys. paged_attention_cpu.cpp cuts the batch
// into items and merges split partitions; attention_tile_impl.hpp computes an item, compiled
// once per instruction set (scalar, AVX2, AVX-512) and picked at run time.
#include <cstdint>

#include "kernels/kv_dtype.hpp"

namespace fp8serve::cpu {

constexpr int kMaxHeadDim = 256;  // per-row stack buffers; every supported model is <= 128
constexpr int kKeyChunk = 32;     // keys scored per online-softmax update

// Elements of type T per 4-byte group of K (kv_k_pack in kernels/paged_kv.hpp).
template <class T>
constexpr int kKPack = 4 / static_cast<int>(sizeof(T));

// 2^f for |f| <= 1/2 as the degree-7 Taylor polynomial of e^(f ln 2), highest degree first
// (error < 1e-8 relative, below float rounding): what each ISA's vector exp2 evaluates.
constexpr int kExp2PolyTerms = 8;
constexpr float kExp2Poly[kExp2PolyTerms] = {1.525273380405984e-05f, 1.5403530393381606e-04f,
                                             1.3333558146428443e-03f, 9.618129107628477e-03f,
                                             5.550410866482158e-02f, 0.2402265069591007f,
                                             0.6931471805599453f, 1.0f};

struct AttentionItem {
  KvDtype dtype = KvDtype::fp8_e4m3;
  // Queries: row r is token r / group, head r % group of the item. q points at the tile's first
  // token, first query head of the KV head's group.
  const float* q = nullptr;  // [num_q_tokens, group, head_dim] with token stride q_token_stride
  int64_t q_token_stride = 0;
  int32_t num_q_tokens = 0;
  int32_t group = 0;      // query heads per KV head
  int32_t first_pos = 0;  // position of the tile's first token; token i sees keys <= first_pos + i
  int32_t key_begin = 0;  // this item's key partition [key_begin, key_end)
  int32_t key_end = 0;
  // Keys and values of this KV head, in the layout of kernels/paged_kv.hpp: block b's keys are
  // the tile [head_dim / P, block_size, P] at k + block_table[b] * block_stride, its value row j
  // at v + block_table[b] * block_stride + j * v_token_stride.
  const int32_t* block_table = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t block_stride = 0;
  int64_t v_token_stride = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  float qk_scale = 0.0f;  // softmax_scale * k_scale (1 * softmax_scale for bf16)
  float v_scale = 1.0f;
  // The bf16 recent window (kernels/paged_kv.hpp; FP8 pool only): keys at positions >=
  // tail_begin come from the sequence's ring in the tail pool, bf16 and exact - K always, V too
  // unless tail_v is null (a K-only window: V of every position stays in the FP8 pool). Ring
  // block of logical block b: tail_first_block + b % tail_ring_blocks. Both segments go through
  // the same online softmax. tail_k == nullptr: no window.
  const void* tail_k = nullptr;  // this KV head's K in the tail pool, from its block 0
  const void* tail_v = nullptr;
  int32_t tail_begin = 0;
  int32_t tail_first_block = 0;
  int32_t tail_ring_blocks = 1;
  int64_t tail_block_stride = 0;
  int64_t tail_v_token_stride = 0;
  float tail_qk_scale = 0.0f;  // softmax_scale: tail keys carry no scale
  // Output. Final (m == nullptr): normalized rows, times v_scale, into out at (token, head).
  // Partial: unnormalized rows (without v_scale) into out as [rows, head_dim] plus the running
  // max m (log2 domain) and sum l per row, for the merge. With a bf16 V tail (tail_v != null),
  // an item whose keys reach the tail (key_end > tail_begin) applies v_scale to the FP8 values
  // itself, where the segments meet: its rows, final or partial, are in the values' own units,
  // and the merge must not apply v_scale to them again (it does to the other partitions').
  float* out = nullptr;
  int64_t out_token_stride = 0;
  float* m = nullptr;  // [rows]
  float* l = nullptr;  // [rows]
};

// The compilations of the same template; the avx ones require the CPU features and
// head_dim % 8 (AVX2) or % 16 (AVX-512) == 0.
void attend_item_scalar(const AttentionItem& item);
void attend_item_avx2(const AttentionItem& item);
void attend_item_avx512(const AttentionItem& item);
void attend_item_avx512bf16(const AttentionItem& item);  // + avx512vbmi, avx512bf16; head_dim % 64 == 0

}  // namespace fp8serve::cpu
