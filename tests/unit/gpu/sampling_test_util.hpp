#pragma once
// Shared by the sampling tests (test_sampling_gpu.cpp, test_sampling_process_gpu.cpp): one launch
// of the device's top-k prefilter (Backend::sample_candidates) and its results on the host.
#include <vector>

#include "cuda_test_util.hpp"
#include "kernels/sampling_ops.hpp"

namespace fp8serve::gpu_test {

struct Candidates {
  std::vector<CandidateRow> rows;
  std::vector<int32_t> ids;
  std::vector<float> logits;
  int32_t k = 0;
};

// The prefilter of `num_rows` rows of `logits` (device, [num_rows, vocab]), each with its own 1/T,
// each row cut into `slices` CTAs (0: as the kernel chooses); raw_wanted: each row's
// raw_sum_wanted (empty: every row's, a null pointer).
inline Candidates prefilter_device(Backend& gpu, const float* logits, std::size_t num_rows, int64_t vocab,
                                   const std::vector<float>& inv_t, int32_t k, int32_t slices = 0,
                                   const std::vector<uint8_t>& raw_wanted = {}) {
  const std::size_t n = num_rows;
  DeviceBuffer d_inv_t = to_device(gpu, inv_t);
  DeviceBuffer d_wanted = to_device(gpu, raw_wanted.empty() ? std::vector<uint8_t>(1, 1) : raw_wanted);
  DeviceBuffer d_rows(gpu, n * sizeof(CandidateRow));
  DeviceBuffer d_ids(gpu, n * static_cast<std::size_t>(k) * sizeof(int32_t));
  DeviceBuffer d_cand(gpu, n * static_cast<std::size_t>(k) * sizeof(float));
  CandidateSampleParams p;
  p.logits = logits;
  p.num_rows = static_cast<int64_t>(n);
  p.vocab_size = vocab;
  p.inv_temperature = d_inv_t.as<float>();
  p.raw_sum_wanted = raw_wanted.empty() ? nullptr : d_wanted.as<uint8_t>();
  p.num_candidates = k;
  p.rows = d_rows.as<CandidateRow>();
  p.ids = d_ids.as<int32_t>();
  p.candidate_logits = d_cand.as<float>();
  p.slices = slices;
  gpu.sample_candidates(p, Stream{});
  Candidates c;
  c.k = k;
  c.rows = to_host<CandidateRow>(gpu, d_rows, n);
  c.ids = to_host<int32_t>(gpu, d_ids, n * static_cast<std::size_t>(k));
  c.logits = to_host<float>(gpu, d_cand, n * static_cast<std::size_t>(k));
  return c;
}

}  // namespace fp8serve::gpu_test
