#pragma once
// Shared by the attention tests: a paged pool with randomly scattered blocks, random K/V/Q,
// and the references the kernels are checked against - plain loops that read the pool through
// their own slot arithmetic (not PagedKvView::offset) and compute attention in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/fp8.hpp"
#include "kernels/paged_kv.hpp"

namespace fp8serve::test {

// One sequence's keys and values in double: [context_len, num_kv_heads, head_dim].
struct SeqKv {
  std::vector<double> k, v;
};

struct SeqSpec {
  int32_t context_len = 0;  // cached + new
  int32_t num_new = 0;      // query tokens this step
};

// A layer's pool plus a batch of sequences whose blocks are scattered over it.
struct PoolFixture {
  KvDtype dtype;
  int32_t block_size, num_kv_heads, head_dim, num_blocks;
  std::vector<uint8_t> k_bytes, v_bytes;  // the pool, viewed as bytes of either dtype
  std::vector<SeqSpec> seqs;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  std::vector<float> k_scales, v_scales;  // [num_seqs]

  PoolFixture(KvDtype dtype_, int32_t block_size_, int32_t num_kv_heads_, int32_t head_dim_,
              std::vector<SeqSpec> seqs_, std::mt19937& rng)
      : dtype(dtype_), block_size(block_size_), num_kv_heads(num_kv_heads_), head_dim(head_dim_),
        seqs(std::move(seqs_)) {
    int32_t needed = 0;
    for (const SeqSpec& s : seqs) {
      const int32_t n = (s.context_len + block_size - 1) / block_size;
      needed += n;
      max_blocks_per_seq = std::max(max_blocks_per_seq, n);
    }
    max_blocks_per_seq += 1;         // a spare column holding junk: must never be read
    num_blocks = needed + 3;         // and blocks nobody owns
    std::vector<int32_t> ids(static_cast<std::size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_tables.assign(seqs.size() * static_cast<std::size_t>(max_blocks_per_seq), -7);
    std::size_t next = 0;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      const int32_t n = (seqs[s].context_len + block_size - 1) / block_size;
      for (int32_t b = 0; b < n; ++b) block_tables[s * max_blocks_per_seq + b] = ids[next++];
    }
    const std::size_t bytes = static_cast<std::size_t>(num_blocks) * block_size * num_kv_heads *
                              head_dim * kv_dtype_size(dtype);
    // Fill with random bytes: unwritten slots hold junk, as in a reused pool. For FP8 avoid
    // the NaN codes, so junk that is wrongly read shows up as a wrong value, not only as NaN.
    k_bytes.resize(bytes);
    v_bytes.resize(bytes);
    for (uint8_t& b : k_bytes) b = static_cast<uint8_t>(rng() % 0x7e);
    for (uint8_t& b : v_bytes) b = static_cast<uint8_t>(rng() % 0x7e);
    k_scales.assign(seqs.size(), 1.0f);
    v_scales.assign(seqs.size(), 1.0f);
  }

  PagedKvView view() {
    return make_paged_kv_view(k_bytes.data(), v_bytes.data(), dtype, num_blocks, block_size,
                              num_kv_heads, head_dim);
  }
  int32_t num_seqs() const { return static_cast<int32_t>(seqs.size()); }

  // Element indices of (sequence, position, kv head, dim) in the documented layouts, through
  // the sequence's block table: K [num_blocks, num_kv_heads, head_dim / P, block_size, P] with
  // P = 4 bytes / element size, V [num_blocks, num_kv_heads, block_size, head_dim].
  int64_t k_index(int32_t seq, int32_t pos, int32_t kv_head, int32_t d) const {
    const int32_t p = dtype == KvDtype::fp8_e4m3 ? 4 : 2;
    const int64_t block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + pos / block_size];
    return (block * num_kv_heads + kv_head) * block_size * head_dim + (d / p) * block_size * p +
           (pos % block_size) * p + d % p;
  }
  int64_t v_index(int32_t seq, int32_t pos, int32_t kv_head, int32_t d) const {
    const int32_t block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + pos / block_size];
    return ((static_cast<int64_t>(block) * num_kv_heads + kv_head) * block_size + pos % block_size) *
               head_dim + d;
  }
  int64_t slot(int32_t seq, int32_t pos) const {
    const int32_t block = block_tables[static_cast<std::size_t>(seq) * max_blocks_per_seq + pos / block_size];
    return static_cast<int64_t>(block) * block_size + pos % block_size;
  }

  // The value the cache holds, dequantized: decode(code) * scale, or the bf16 value.
  double stored(const std::vector<uint8_t>& pool, float scale, int64_t i) const {
    if (dtype == KvDtype::bf16) {
      uint16_t h;
      std::memcpy(&h, pool.data() + 2 * i, 2);
      return bf16_decode(h);
    }
    return static_cast<double>(fp8_e4m3_decode(pool[static_cast<std::size_t>(i)])) * scale;
  }
  // The sequence's whole context as the cache holds it: [context_len, num_kv_heads, head_dim].
  SeqKv dequantized(int32_t seq) const {
    const int32_t len = seqs[static_cast<std::size_t>(seq)].context_len;
    SeqKv kv;
    kv.k.resize(static_cast<std::size_t>(len) * num_kv_heads * head_dim);
    kv.v.resize(kv.k.size());
    std::size_t i = 0;
    for (int32_t pos = 0; pos < len; ++pos) {
      for (int32_t h = 0; h < num_kv_heads; ++h) {
        for (int32_t d = 0; d < head_dim; ++d, ++i) {
          kv.k[i] = stored(k_bytes, k_scales[seq], k_index(seq, pos, h, d));
          kv.v[i] = stored(v_bytes, v_scales[seq], v_index(seq, pos, h, d));
        }
      }
    }
    return kv;
  }
};

// The bf16 recent window's tail pool for a PoolFixture's sequences (kernels/paged_kv.hpp): one
// ring of ring_blocks blocks per sequence, the rings in shuffled order among spare ones, junk
// in every slot. values == false: a K-only window (no V tail). fp8_lens says where each
// sequence's tail starts.
struct TailFixture {
  int32_t ring_blocks = 0;
  bool values = true;
  int32_t num_rings = 0;
  std::vector<uint8_t> k_bytes, v_bytes;  // bf16 elements
  std::vector<int32_t> rings;             // [num_seqs]
  std::vector<int32_t> fp8_lens;          // [num_seqs]

  TailFixture(const PoolFixture& pool, int32_t window, bool values_, std::mt19937& rng)
      : ring_blocks(window / pool.block_size + 1), values(values_), num_rings(pool.num_seqs() + 2) {
    std::vector<int32_t> ids(static_cast<std::size_t>(num_rings));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    rings.assign(ids.begin(), ids.begin() + pool.num_seqs());
    const std::size_t bytes = static_cast<std::size_t>(num_rings) * ring_blocks * pool.block_size *
                              pool.num_kv_heads * pool.head_dim * 2;
    k_bytes.resize(bytes);
    v_bytes.resize(values ? bytes : 0);
    for (uint8_t& b : k_bytes) b = static_cast<uint8_t>(rng() % 0x7e);  // no NaN or huge bf16 junk
    for (uint8_t& b : v_bytes) b = static_cast<uint8_t>(rng() % 0x7e);
    // The engine's rule: the newest `window` tokens (whole blocks) in the tail.
    for (const SeqSpec& s : pool.seqs) {
      fp8_lens.push_back(s.context_len > window ? (s.context_len - window) / pool.block_size * pool.block_size : 0);
    }
  }

  PagedKvView view(const PoolFixture& pool) {
    return make_paged_kv_view(k_bytes.data(), values ? v_bytes.data() : nullptr, KvDtype::bf16,
                              num_rings * ring_blocks, pool.block_size, pool.num_kv_heads, pool.head_dim);
  }
  void attach(PagedBatch& batch) const {
    batch.fp8_lens = fp8_lens.data();
    batch.tail_slots = rings.data();
    batch.tail_ring_blocks = ring_blocks;
  }
  // Element indices in the tail pool, by the test's own arithmetic: ring block (pos / B) % R.
  int64_t block(const PoolFixture& pool, int32_t seq, int32_t pos) const {
    return static_cast<int64_t>(rings[static_cast<std::size_t>(seq)]) * ring_blocks + (pos / pool.block_size) % ring_blocks;
  }
  int64_t k_index(const PoolFixture& pool, int32_t seq, int32_t pos, int32_t kv_head, int32_t d) const {
    return (block(pool, seq, pos) * pool.num_kv_heads + kv_head) * pool.block_size * pool.head_dim +
           (d / 2) * pool.block_size * 2 + (pos % pool.block_size) * 2 + d % 2;
  }
  int64_t v_index(const PoolFixture& pool, int32_t seq, int32_t pos, int32_t kv_head, int32_t d) const {
    return ((block(pool, seq, pos) * pool.num_kv_heads + kv_head) * pool.block_size + pos % pool.block_size) *
               pool.head_dim + d;
  }
  static double bf16_at(const std::vector<uint8_t>& bytes, int64_t i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return bf16_decode(h);
  }
  // The sequence's context as the kernels must read it: the FP8 pool below fp8_lens (and all of
  // V in a K-only window), the tail's exact bf16 from there on.
  SeqKv stored(const PoolFixture& pool, int32_t seq) const {
    SeqKv kv = pool.dequantized(seq);
    const int32_t len = pool.seqs[static_cast<std::size_t>(seq)].context_len;
    for (int32_t pos = fp8_lens[static_cast<std::size_t>(seq)]; pos < len; ++pos) {
      for (int32_t h = 0; h < pool.num_kv_heads; ++h) {
        for (int32_t d = 0; d < pool.head_dim; ++d) {
          const std::size_t i = (static_cast<std::size_t>(pos) * pool.num_kv_heads + h) * pool.head_dim + d;
          kv.k[i] = bf16_at(k_bytes, k_index(pool, seq, pos, h, d));
          if (values) kv.v[i] = bf16_at(v_bytes, v_index(pool, seq, pos, h, d));
        }
      }
    }
    return kv;
  }
};

// Batch arrays for one step: every sequence's last num_new tokens are the queries.
struct BatchArrays {
  std::vector<int32_t> query_start_loc, context_lens;
  std::vector<int64_t> slot_mapping;
  std::vector<uint8_t> calibrate;

  BatchArrays(const PoolFixture& pool) {
    query_start_loc.push_back(0);
    for (int32_t s = 0; s < pool.num_seqs(); ++s) {
      const SeqSpec& spec = pool.seqs[static_cast<std::size_t>(s)];
      query_start_loc.push_back(query_start_loc.back() + spec.num_new);
      context_lens.push_back(spec.context_len);
      for (int32_t i = 0; i < spec.num_new; ++i) {
        slot_mapping.push_back(pool.slot(s, spec.context_len - spec.num_new + i));
      }
    }
    calibrate.assign(pool.seqs.size(), 0);
  }
  PagedBatch batch(PoolFixture& pool) {
    PagedBatch b;
    b.num_seqs = pool.num_seqs();
    b.num_tokens = query_start_loc.back();
    b.query_start_loc = query_start_loc.data();
    b.context_lens = context_lens.data();
    b.block_tables = pool.block_tables.data();
    b.max_blocks_per_seq = pool.max_blocks_per_seq;
    b.slot_mapping = slot_mapping.data();
    b.k_scales = pool.k_scales.data();
    b.v_scales = pool.v_scales.data();
    b.calibrate = calibrate.data();
    return b;
  }
};

inline std::vector<float> random_normal(std::size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Plain attention in double: for query token i of sequence s at position p,
// out = sum_j softmax_j(q . k_j * softmax_scale) v_j over positions j <= p.
// q, out: [num_tokens, num_heads, head_dim]; kv[s] holds sequence s's whole context.
inline std::vector<double> reference_attention(const std::vector<SeqSpec>& seqs,
                                               const std::vector<SeqKv>& kv, int32_t num_kv_heads,
                                               int32_t head_dim, const std::vector<float>& q,
                                               int32_t num_heads, float softmax_scale) {
  const int32_t hd = head_dim;
  const int32_t group = num_heads / num_kv_heads;
  int32_t num_tokens = 0;
  for (const SeqSpec& s : seqs) num_tokens += s.num_new;
  std::vector<double> out(static_cast<std::size_t>(num_tokens) * num_heads * hd, 0.0);
  int32_t token = 0;
  for (std::size_t s = 0; s < seqs.size(); ++s) {
    const SeqSpec& spec = seqs[s];
    for (int32_t i = 0; i < spec.num_new; ++i, ++token) {
      const int32_t pos = spec.context_len - spec.num_new + i;
      for (int32_t h = 0; h < num_heads; ++h) {
        const int32_t kvh = h / group;
        const float* qr = q.data() + (static_cast<int64_t>(token) * num_heads + h) * hd;
        std::vector<double> score(static_cast<std::size_t>(pos) + 1);
        double m = -INFINITY;
        for (int32_t j = 0; j <= pos; ++j) {
          const double* k = kv[s].k.data() + (static_cast<int64_t>(j) * num_kv_heads + kvh) * hd;
          double dot = 0.0;
          for (int32_t d = 0; d < hd; ++d) dot += static_cast<double>(qr[d]) * k[d];
          score[static_cast<std::size_t>(j)] = dot * softmax_scale;
          m = std::max(m, score[static_cast<std::size_t>(j)]);
        }
        double sum = 0.0;
        for (double& x : score) sum += (x = std::exp(x - m));
        double* o = out.data() + (static_cast<int64_t>(token) * num_heads + h) * hd;
        for (int32_t j = 0; j <= pos; ++j) {
          const double* v = kv[s].v.data() + (static_cast<int64_t>(j) * num_kv_heads + kvh) * hd;
          const double p = score[static_cast<std::size_t>(j)] / sum;
          for (int32_t d = 0; d < hd; ++d) o[d] += p * v[d];
        }
      }
    }
  }
  return out;
}

}  // namespace fp8serve::test
