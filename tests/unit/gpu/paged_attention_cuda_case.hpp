#pragma once
// One CUDA paged-attention case, end to end: a pool with scattered blocks (FP8 or bf16), each
// sequence's context written as kv_write would (random K with outlier channels and V, quantized
// with a calibrated per-sequence scale), optionally a bf16 tail holding different values for
// the positions at and above fp8_lens[s], bf16 queries with a fused-qkv token stride; the
// kernels run through paged_attention_cuda() (on the GPU or the emulator) and the output is
// compared with attention in double over exactly what the pools hold (tests/unit/attention's
// reference), tail positions taken from the tail.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_runtime.hpp"
#include "kernels/cuda/paged_attention_cuda.hpp"
#include "kernels/fp8.hpp"
#include "tests/unit/attention/attention_test_util.hpp"

namespace fp8serve::test {

inline bool have_cuda_device() {
  if (cuda::device_count() > 0) return true;
  WARN("no CUDA device: [gpu] test skipped");
  return false;
}

struct CudaAttentionCase {
  KvDtype dtype = KvDtype::fp8_e4m3;
  int32_t num_heads = 8, num_kv_heads = 2, head_dim = 128, block_size = 16;
  std::vector<SeqSpec> seqs;  // {context_len, num_new}
  std::vector<int32_t> fp8_lens;  // non-empty: the bf16 window is on; positions >= fp8_lens[s] in the tail
  int32_t tail_ring_blocks = 0;
  bool tail_k_only = false;  // the tail holds K alone; V is read from the FP8 pool everywhere
  float q_multiplier = 1.0f;  // the queries' scale: N(0, 1) times this, in bf16
  cuda::PagedAttentionCudaOptions options;
  uint32_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << (dtype == KvDtype::fp8_e4m3 ? "fp8" : "bf16") << " heads " << num_heads << "/" << num_kv_heads << " dim "
      << head_dim << " block " << block_size << " partition " << options.partition_tokens << " math "
      << static_cast<int>(options.prefill_math) << " decode math " << static_cast<int>(options.decode_math) << " seqs";
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      s << " " << seqs[i].context_len << "/" << seqs[i].num_new;
      if (!fp8_lens.empty()) s << "(fp8 " << fp8_lens[i] << (tail_k_only ? ", K-only tail)" : ")");
    }
    return s.str();
  }
};

// The shapes the tests sweep: real head dims and GQA ratios (KV heads cut to 1-3 so that the
// emulated runs stay short), each at one block size.
struct CaseShape {
  int32_t heads, kv_heads, head_dim, block_size;
};
inline const std::vector<CaseShape>& model_shapes() {
  static const std::vector<CaseShape> shapes = {
      {4, 4, 64, 16},   // group 1 (multi-head attention, Llama-2-style)
      {8, 2, 128, 16},  // Llama-3-8B / Qwen3-8B: group 4, head_dim 128
      {4, 2, 128, 32},  // Qwen3-0.6B: group 2
      {9, 3, 64, 8},    // SmolLM2-135M
      {4, 2, 16, 32},   // tiny-llama, tiny-qwen2
      {4, 2, 32, 16},   // tiny-qwen3
      {16, 2, 64, 16},  // group 8
      {16, 1, 64, 8},   // group 16: decode serves it as two subgroups of 8 heads
      {4, 2, 256, 8},   // head_dim 256
      {6, 2, 80, 32},   // head_dim 80, through the 128 build
  };
  return shapes;
}

inline CudaAttentionCase shaped_case(const CaseShape& shape, KvDtype dtype, std::vector<SeqSpec> seqs, uint32_t seed) {
  CudaAttentionCase c;
  c.dtype = dtype;
  c.num_heads = shape.heads;
  c.num_kv_heads = shape.kv_heads;
  c.head_dim = shape.head_dim;
  c.block_size = shape.block_size;
  c.seqs = std::move(seqs);
  c.seed = seed;
  return c;
}

// The workspace a test gives paged_attention_cuda: what the limits need, and 32 MiB more where the
// options force small partitions (they need more slots than decode_partition's split of the batch).
inline std::size_t test_workspace_bytes(const cuda::PagedAttentionCudaLimits& limits,
                                        const cuda::PagedAttentionCudaOptions& options) {
  const std::size_t bytes = cuda::paged_attention_cuda_workspace_bytes(limits);
  return options.partition_tokens > 0 ? bytes + (std::size_t{32} << 20) : bytes;
}

struct CudaAttentionResult {
  // max over outputs of (|out - ref| - 2^-8 |ref|) / max |v| of the sequence: the error beyond
  // rounding the output to bf16 (at most 2^-8 relative), as a fraction of the values averaged.
  double max_error = 0.0;
  bool all_finite = true;
  bool padding_untouched = true;  // out's elements between token rows were not written
};

namespace detail {

template <class T>
cuda::DeviceBuffer upload(const std::vector<T>& host) {
  cuda::DeviceBuffer buffer(std::max<std::size_t>(host.size() * sizeof(T), 16));
  if (!host.empty()) buffer.copy_from_host(host.data(), host.size() * sizeof(T));
  return buffer;
}

// Stores value x of element `index` of a pool in its dtype (FP8 with `scale`).
inline void store(std::vector<uint8_t>& bytes, KvDtype dtype, int64_t index, float x, float scale) {
  if (dtype == KvDtype::bf16) {
    const uint16_t h = bf16_encode(x);
    std::memcpy(bytes.data() + 2 * index, &h, 2);
  } else {
    bytes[static_cast<std::size_t>(index)] = fp8_e4m3_encode(x / scale);
  }
}

}  // namespace detail

inline CudaAttentionResult run_cuda_attention_case(const CudaAttentionCase& c) {
  std::mt19937 rng(c.seed);
  PoolFixture pool(c.dtype, c.block_size, c.num_kv_heads, c.head_dim, c.seqs, rng);
  const int32_t num_seqs = pool.num_seqs();
  const int32_t hd = c.head_dim, kvh = c.num_kv_heads;
  const bool window = !c.fp8_lens.empty();
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Contexts as kv_write leaves them: K with a few large channels (as real keys have), scales
  // calibrated on the whole context with a margin of 2.
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t len = c.seqs[static_cast<std::size_t>(s)].context_len;
    const std::size_t n = static_cast<std::size_t>(len) * kvh * hd;
    std::vector<float> k = random_normal(n, rng), v = random_normal(n, rng);
    for (std::size_t i = 0; i < n; i += static_cast<std::size_t>(hd)) k[i + 3] *= 6.0f;
    float k_amax = 0.0f, v_amax = 0.0f;
    for (std::size_t i = 0; i < n; ++i) {
      k_amax = std::max(k_amax, std::abs(k[i]));
      v_amax = std::max(v_amax, std::abs(v[i]));
    }
    if (c.dtype == KvDtype::fp8_e4m3) {
      pool.k_scales[static_cast<std::size_t>(s)] = std::max(k_amax * 2.0f / kFp8E4m3Max, FLT_MIN);
      pool.v_scales[static_cast<std::size_t>(s)] = std::max(v_amax * 2.0f / kFp8E4m3Max, FLT_MIN);
    }
    std::size_t i = 0;
    for (int32_t pos = 0; pos < len; ++pos)
      for (int32_t h = 0; h < kvh; ++h)
        for (int32_t d = 0; d < hd; ++d, ++i) {
          detail::store(pool.k_bytes, c.dtype, pool.k_index(s, pos, h, d), k[i], pool.k_scales[static_cast<std::size_t>(s)]);
          detail::store(pool.v_bytes, c.dtype, pool.v_index(s, pos, h, d), v[i], pool.v_scales[static_cast<std::size_t>(s)]);
        }
  }
  std::vector<SeqKv> kv;
  for (int32_t s = 0; s < num_seqs; ++s) kv.push_back(pool.dequantized(s));

  // The tail: ring blocks of sequence s are s * ring .. s * ring + ring - 1; junk elsewhere.
  const int32_t ring = window ? c.tail_ring_blocks : 0;
  const int32_t tail_blocks = std::max(1, num_seqs * ring);
  const std::size_t tail_elems = static_cast<std::size_t>(tail_blocks) * c.block_size * kvh * hd;
  std::vector<uint16_t> tail_k(tail_elems), tail_v(tail_elems);
  for (auto& x : tail_k) x = bf16_encode(std::normal_distribution<float>(0.0f, 3.0f)(rng));
  for (auto& x : tail_v) x = bf16_encode(std::normal_distribution<float>(0.0f, 3.0f)(rng));
  std::vector<int32_t> tail_slots;
  if (window) {
    const int32_t kpack = 2;
    for (int32_t s = 0; s < num_seqs; ++s) {
      tail_slots.push_back(s);
      const int32_t len = c.seqs[static_cast<std::size_t>(s)].context_len;
      for (int32_t pos = c.fp8_lens[static_cast<std::size_t>(s)]; pos < len; ++pos) {
        const int64_t block = int64_t{s} * ring + (pos / c.block_size) % ring;
        for (int32_t h = 0; h < kvh; ++h)
          for (int32_t d = 0; d < hd; ++d) {
            const int64_t base = (block * kvh + h) * c.block_size * hd;
            const int64_t ki = base + (d / kpack) * c.block_size * kpack + (pos % c.block_size) * kpack + d % kpack;
            const int64_t vi = base + (pos % c.block_size) * hd + d;
            const std::size_t r = (static_cast<std::size_t>(pos) * kvh + h) * hd + d;
            kv[static_cast<std::size_t>(s)].k[r] = bf16_decode(tail_k[static_cast<std::size_t>(ki)]);
            if (!c.tail_k_only) kv[static_cast<std::size_t>(s)].v[r] = bf16_decode(tail_v[static_cast<std::size_t>(vi)]);
          }
      }
    }
  }

  // Queries in bf16, with the fused qkv's token stride; out with a padded token stride.
  BatchArrays arrays(pool);
  const int32_t num_tokens = arrays.query_start_loc.back();
  const int64_t row = int64_t{c.num_heads} * hd;
  const int64_t q_stride = row + 2 * int64_t{kvh} * hd, out_stride = row + 8;
  std::vector<uint16_t> q_bits(static_cast<std::size_t>(num_tokens) * q_stride);
  std::vector<float> q_packed(static_cast<std::size_t>(num_tokens) * row);
  for (int32_t t = 0; t < num_tokens; ++t)
    for (int64_t j = 0; j < q_stride; ++j) {
      const uint16_t h = bf16_encode(std::normal_distribution<float>(0.0f, 1.0f)(rng) * c.q_multiplier);
      q_bits[static_cast<std::size_t>(t * q_stride + j)] = h;
      if (j < row) q_packed[static_cast<std::size_t>(t * row + j)] = bf16_decode(h);
    }
  const uint16_t sentinel = 0x7fc0;  // NaN: an output the kernels do not write stays NaN
  std::vector<uint16_t> out_bits(static_cast<std::size_t>(num_tokens) * out_stride, sentinel);

  auto d_k = detail::upload(pool.k_bytes), d_v = detail::upload(pool.v_bytes);
  auto d_tail_k = detail::upload(tail_k), d_tail_v = detail::upload(tail_v);
  auto d_q = detail::upload(q_bits), d_out = detail::upload(out_bits);
  auto d_starts = detail::upload(arrays.query_start_loc), d_lens = detail::upload(arrays.context_lens);
  auto d_tables = detail::upload(pool.block_tables);
  auto d_k_scales = detail::upload(pool.k_scales), d_v_scales = detail::upload(pool.v_scales);
  auto d_fp8_lens = detail::upload(c.fp8_lens), d_tail_slots = detail::upload(tail_slots);

  PagedAttentionParams p;
  p.q = d_q.data();
  p.out = d_out.data();
  p.q_token_stride = q_stride;
  p.out_token_stride = out_stride;
  p.num_heads = c.num_heads;
  p.softmax_scale = softmax_scale;
  p.cache = make_paged_kv_view(d_k.data(), d_v.data(), c.dtype, pool.num_blocks, c.block_size, kvh, hd);
  p.tail = make_paged_kv_view(d_tail_k.data(), d_tail_v.data(), KvDtype::bf16, tail_blocks, c.block_size, kvh, hd);
  p.batch.num_seqs = num_seqs;
  p.batch.num_tokens = num_tokens;
  p.batch.query_start_loc = static_cast<const int32_t*>(d_starts.data());
  p.batch.context_lens = static_cast<const int32_t*>(d_lens.data());
  p.batch.block_tables = static_cast<const int32_t*>(d_tables.data());
  p.batch.max_blocks_per_seq = pool.max_blocks_per_seq;
  p.batch.k_scales = static_cast<float*>(d_k_scales.data());
  p.batch.v_scales = static_cast<float*>(d_v_scales.data());
  if (window) {
    p.batch.fp8_lens = static_cast<const int32_t*>(d_fp8_lens.data());
    p.batch.tail_slots = static_cast<const int32_t*>(d_tail_slots.data());
    p.batch.tail_ring_blocks = ring;
    if (c.tail_k_only) p.tail.v = nullptr;
  }
  cuda::PagedAttentionCudaLimits limits;
  limits.max_num_seqs = num_seqs;
  limits.num_heads = c.num_heads;
  limits.num_kv_heads = kvh;
  limits.head_dim = hd;
  const std::size_t workspace_bytes = test_workspace_bytes(limits, c.options);
  cuda::DeviceBuffer workspace(workspace_bytes);
  cuda::paged_attention_cuda(p, workspace.data(), workspace_bytes, nullptr, c.options);
  CUDA_CHECK(cudaDeviceSynchronize());
  d_out.copy_to_host(out_bits.data(), out_bits.size() * sizeof(uint16_t));

  const std::vector<double> want =
      reference_attention(c.seqs, kv, kvh, hd, q_packed, c.num_heads, softmax_scale);
  CudaAttentionResult result;
  int32_t token = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    double v_max = 0.0;
    for (double x : kv[static_cast<std::size_t>(s)].v) v_max = std::max(v_max, std::abs(x));
    for (int32_t i = 0; i < c.seqs[static_cast<std::size_t>(s)].num_new; ++i, ++token) {
      for (int64_t j = 0; j < out_stride; ++j) {
        const uint16_t bits = out_bits[static_cast<std::size_t>(token * out_stride + j)];
        if (j >= row) {
          result.padding_untouched = result.padding_untouched && bits == sentinel;
          continue;
        }
        const double got = bf16_decode(bits);
        if (!std::isfinite(got)) {
          result.all_finite = false;
          continue;
        }
        const double ref = want[static_cast<std::size_t>(token * row + j)];
        const double err = (std::abs(got - ref) - std::ldexp(std::abs(ref), -8)) / v_max;
        result.max_error = std::max(result.max_error, err);
      }
    }
  }
  return result;
}

// Whether the case's decode tokens run on tensor cores (paged_attention_cuda.hpp's DecodeMath).
inline bool decode_on_tensor_cores(const CudaAttentionCase& c) {
  using Math = cuda::PagedAttentionCudaOptions::DecodeMath;
  return c.options.decode_math == Math::mma || (c.options.decode_math == Math::best && c.num_heads / c.num_kv_heads >= 4);
}

// The tolerance of a case (the prefill and decode tests' headers derive them), as a fraction of
// max|v|: 1e-4 when every probability stays fp32 (SIMT decode and prefill); tensor cores round
// the probabilities for P V: to bf16 (relative 2^-8, so at most 2^-8 max|v| in the output: 4e-3)
// for bf16 V and for prefill chunks, to f16 (2^-11: 1e-3) for FP8 V in the decode.
inline double attention_tolerance(const CudaAttentionCase& c) {
  bool chunks = false, decodes = false;
  for (const SeqSpec& s : c.seqs) {
    chunks = chunks || s.num_new >= 2;
    decodes = decodes || s.num_new == 1;
  }
  double tolerance = 1e-4;
  if (chunks && c.options.prefill_math != cuda::PagedAttentionCudaOptions::PrefillMath::simt) tolerance = 4e-3;
  if (decodes && decode_on_tensor_cores(c)) {
    const bool bf16_v = c.dtype == KvDtype::bf16 || (!c.fp8_lens.empty() && !c.tail_k_only);
    tolerance = std::max(tolerance, bf16_v ? 4e-3 : 1e-3);
  }
  return tolerance;
}

// Runs the case and checks it: every output written and finite, nothing written between token
// rows, and the error beyond the output's bf16 rounding within `tolerance` of max|v|.
inline void check_cuda_attention_case(const CudaAttentionCase& c, double tolerance) {
  INFO(c.describe());
  const CudaAttentionResult r = run_cuda_attention_case(c);
  CHECK(r.all_finite);
  CHECK(r.padding_untouched);
  CHECK(r.max_error <= tolerance);
}

}  // namespace fp8serve::test
