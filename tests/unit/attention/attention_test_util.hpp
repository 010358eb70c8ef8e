#pragma once
// Shared by the attention tests: a paged pool with randomly scattered blocks (and the bf16
// window's tail pool), random K/V/Q, and the references the kernels are checked against - plain
// loops that read the pool through their own slot arithmetic (not PagedKvView::offset) and
// compute attention in double - with the tolerances test_paged_attention.cpp explains.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cpu/kv_write_cpu.hpp"
#include "kernels/cpu/paged_attention_cpu.hpp"
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

// Tolerances (test_paged_attention.cpp's header derives them).
constexpr double kTight = 1e-5;
constexpr double kTightBf16Dot = 1.5e-2;
constexpr double kLooseFp8 = 0.10;
constexpr double kLooseBf16 = 0.0064;

// The tight limit for the build `isa` resolves to on this CPU.
inline double tight_limit(cpu::CpuIsa isa, int32_t head_dim) {
  return cpu::resolve_cpu_isa(isa, head_dim) == cpu::CpuIsa::avx512bf16 ? kTightBf16Dot : kTight;
}

// Writes every sequence's whole context through kv_write as one calibrating chunk (with a
// tail: through the window, positions from tail->fp8_lens on into the tail), so the pools hold
// exactly what the kernel would have written. Keys get a few large channels (as real keys do)
// so the scale is set by outliers. Returns the unquantized values.
inline std::vector<SeqKv> fill_context(PoolFixture& pool, cpu::ThreadPool& threads, std::mt19937& rng,
                                       TailFixture* tail = nullptr) {
  const int32_t row = pool.num_kv_heads * pool.head_dim;
  std::vector<int32_t> starts{0}, lens;
  std::vector<int64_t> slots;
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const int32_t len = pool.seqs[static_cast<std::size_t>(s)].context_len;
    starts.push_back(starts.back() + len);
    lens.push_back(len);
    for (int32_t p = 0; p < len; ++p) slots.push_back(pool.slot(s, p));
  }
  const std::size_t n = static_cast<std::size_t>(starts.back()) * row;
  std::vector<float> k = random_normal(n, rng), v = random_normal(n, rng);
  for (std::size_t i = 0; i < n; i += static_cast<std::size_t>(pool.head_dim)) k[i + 3] *= 6.0f;
  std::vector<uint8_t> calibrate(pool.seqs.size(), 1);
  KvWriteParams w;
  w.k = k.data();
  w.v = v.data();
  w.k_token_stride = w.v_token_stride = row;
  w.cache = pool.view();
  w.batch.num_seqs = pool.num_seqs();
  w.batch.num_tokens = starts.back();
  w.batch.query_start_loc = starts.data();
  w.batch.context_lens = lens.data();
  w.batch.block_tables = pool.block_tables.data();
  w.batch.max_blocks_per_seq = pool.max_blocks_per_seq;
  w.batch.slot_mapping = slots.data();
  w.batch.k_scales = pool.k_scales.data();
  w.batch.v_scales = pool.v_scales.data();
  w.batch.calibrate = calibrate.data();
  if (tail != nullptr) {
    w.tail = tail->view(pool);
    tail->attach(w.batch);
  }
  cpu::kv_write_cpu(w, threads);
  std::vector<SeqKv> raw(pool.seqs.size());
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const std::size_t first = static_cast<std::size_t>(starts[s]) * row;
    const std::size_t last = static_cast<std::size_t>(starts[s + 1]) * row;
    raw[s].k.assign(k.begin() + first, k.begin() + last);
    raw[s].v.assign(v.begin() + first, v.begin() + last);
  }
  return raw;
}

// One attention call over the pool's step (every sequence's last num_new tokens), random q.
struct Run {
  std::vector<float> q, out;
  int32_t num_heads;
  BatchArrays arrays;
  PagedAttentionParams params;

  Run(PoolFixture& pool, int32_t num_heads_, std::mt19937& rng, TailFixture* tail = nullptr)
      : num_heads(num_heads_), arrays(pool) {
    const std::size_t n = static_cast<std::size_t>(arrays.query_start_loc.back()) * num_heads * pool.head_dim;
    q = random_normal(n, rng, 1.5f);
    out.assign(n, NAN);
    params.q = q.data();
    params.out = out.data();
    params.q_token_stride = params.out_token_stride = static_cast<int64_t>(num_heads) * pool.head_dim;
    params.num_heads = num_heads;
    params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(pool.head_dim));
    params.cache = pool.view();
    params.batch = arrays.batch(pool);
    if (tail != nullptr) {
      params.tail = tail->view(pool);
      tail->attach(params.batch);
    }
  }
};

// max over elements of |out - ref| / max|v of that sequence and kv head|: errors measured
// against the size of the values being averaged.
inline double max_scaled_error(const PoolFixture& pool, const std::vector<SeqKv>& kv, const std::vector<float>& out,
                               const std::vector<double>& ref, int32_t num_heads) {
  const int32_t hd = pool.head_dim, group = num_heads / pool.num_kv_heads;
  double worst = 0.0;
  int64_t token = 0;
  for (std::size_t s = 0; s < pool.seqs.size(); ++s) {
    for (int32_t i = 0; i < pool.seqs[s].num_new; ++i, ++token) {
      for (int32_t h = 0; h < num_heads; ++h) {
        double vmax = 1e-30;
        for (int32_t j = 0; j < pool.seqs[s].context_len; ++j) {
          for (int32_t d = 0; d < hd; ++d) {
            vmax = std::max(vmax, std::fabs(kv[s].v[(static_cast<std::size_t>(j) * pool.num_kv_heads + h / group) * hd + d]));
          }
        }
        for (int32_t d = 0; d < hd; ++d) {
          const std::size_t e = (static_cast<std::size_t>(token) * num_heads + h) * hd + d;
          const double err = std::fabs(static_cast<double>(out[e]) - ref[e]) / vmax;
          if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
        }
      }
    }
  }
  return worst;
}

// sqrt(sum (out - ref)^2 / sum ref^2).
inline double relative_rms_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Runs each sequence of `run` alone in a batch of one and returns the first whose rows are not
// bit-identical to `reference` (the batched output), or -1: the engine relies on that.
inline int32_t first_sequence_not_alone_invariant(const Run& run, PoolFixture& pool, const TailFixture* tail,
                                                   cpu::ThreadPool& threads, cpu::AttentionWorkspace& workspace,
                                                   const std::vector<float>& reference) {
  const int64_t row = static_cast<int64_t>(run.num_heads) * pool.head_dim;
  for (int32_t s = 0; s < pool.num_seqs(); ++s) {
    const int32_t first = run.arrays.query_start_loc[s];
    const int32_t count = pool.seqs[static_cast<std::size_t>(s)].num_new;
    const int32_t starts[2] = {0, count};
    std::vector<float> out(static_cast<std::size_t>(count * row), NAN);
    PagedAttentionParams alone = run.params;
    alone.q = run.q.data() + first * row;
    alone.out = out.data();
    alone.batch.num_seqs = 1;
    alone.batch.num_tokens = count;
    alone.batch.query_start_loc = starts;
    alone.batch.context_lens = run.arrays.context_lens.data() + s;
    alone.batch.block_tables = pool.block_tables.data() + static_cast<int64_t>(s) * pool.max_blocks_per_seq;
    alone.batch.k_scales = pool.k_scales.data() + s;
    alone.batch.v_scales = pool.v_scales.data() + s;
    if (tail != nullptr) {
      alone.batch.fp8_lens = tail->fp8_lens.data() + s;
      alone.batch.tail_slots = tail->rings.data() + s;
    }
    cpu::paged_attention_cpu(alone, threads, workspace);
    if (std::memcmp(out.data(), reference.data() + first * row, out.size() * sizeof(float)) != 0) return s;
  }
  return -1;
}

}  // namespace fp8serve::test
