// bench_sampling: where sampling should run on a GPU server, decided by measurement. The CUDA
// backend returns only the sampled rows' logits (fp32, one row per sequence) and the host samples
// them (server/engine/sampling.hpp, the same code as on the CPU). This prints, for the vocabularies of
// the families we serve, the host's time per row for each kind of request, and the bytes a row
// brings back over PCIe, so that a step's sampling cost can be set against its GPU time.
//
//   bench_sampling [--rows N]
//   bench_sampling --device cuda [--steps N] [--batch B] [--quick]
//
// --device cuda: sampling on the GPU (Backend::sample_greedy / sample_candidates) for a decode step
// of 64 sequences at Llama 3's 128,256 vocabulary, peaked rows: per step, the kernels and the
// copy back of their results (one sync), then the host's share (accepting the picks, or the
// seeded draws from the candidates on one thread), against the old path (the 33 MB of logits
// copied back, and the host sampling them on one thread). tests/gpu/summary.py sets the per-step
// figures against bench_forward's decode step at batch 64 (the target: < 2% for top-p).
//
// Two kinds of rows: "peaked", like a language model's next-token logits (a background of
// N(0, 2^2) and 40 candidates 8-14 above it: top-p 0.95 keeps tens of tokens), and "flat",
// N(0, 2.5^2) everywhere (top-p 0.95 keeps thousands: the worst case of the nucleus search).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "server/engine/sampling.hpp"
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
#include "kernels/cuda/make_cuda_backend.hpp"  // bench_sampling_emu: the device mode on the emulator
#else
#include "server/engine/device_select.hpp"
#endif

using namespace fp8serve;

namespace {

struct Kind {
  const char* name;
  SamplingParams params;
};

std::vector<Kind> kinds() {
  std::vector<Kind> k;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  k.push_back({"greedy", greedy});
  SamplingParams greedy_lp = greedy;
  greedy_lp.num_logprobs = 5;
  k.push_back({"greedy + top-5 logprobs", greedy_lp});
  SamplingParams temp;
  temp.temperature = 0.8f;
  k.push_back({"temperature 0.8", temp});
  SamplingParams top_p = temp;
  top_p.top_p = 0.95f;
  k.push_back({"temperature 0.8, top_p 0.95", top_p});
  SamplingParams all = top_p;
  all.top_k = 50;
  all.min_p = 0.05f;
  all.presence_penalty = 0.5f;
  all.frequency_penalty = 0.5f;
  all.repetition_penalty = 1.1f;
  k.push_back({"top_k 50, min_p, penalties", all});
  return k;
}

// Seconds per call of fn, the mean over `steps` calls after one warm-up call.
template <class Fn>
double seconds_per_call(int steps, Fn&& fn) {
  fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

std::unique_ptr<Backend> make_backend(const std::string& kind) {
#if defined(FP8SERVE_CUDA_EMU) && FP8SERVE_CUDA_EMU
  if (kind != "cuda") return nullptr;
  return cuda::make_cuda_backend(0);
#else
  try {
    return std::move(make_device(kind, 1).backend);
  } catch (const std::exception& e) {
    std::printf("bench_sampling: %s\n", e.what());
    return nullptr;
  }
#endif
}

int run_device(const std::string& kind, int steps, int batch) {
  const std::unique_ptr<Backend> backend = make_backend(kind);
  if (!backend) return 1;
  Backend& gpu = *backend;
  if (!gpu.supports_device_sampling()) {
    std::printf("bench_sampling: the %s backend samples on the host\n", kind.c_str());
    return 1;
  }
  const int vocab = 128256;
  const int k = kMaxSampleCandidates;
  std::printf("bench_sampling: device %s, batch %d, vocab %d, %d steps per figure\n", gpu.describe().c_str(), batch,
              vocab, steps);
  // Peaked rows, as a model's: N(0, 1.6^2) and 40 candidates 8-14 above it.
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 1.6f);
  std::uniform_int_distribution<int> pick(0, vocab - 1);
  std::uniform_real_distribution<float> lift(8.0f, 14.0f);
  HostArray<float> host_logits(gpu);
  host_logits.resize(static_cast<std::size_t>(batch) * vocab);
  for (std::size_t i = 0; i < host_logits.size(); ++i) host_logits.data()[i] = logit(rng);
  for (int r = 0; r < batch; ++r)
    for (int i = 0; i < 40; ++i) host_logits.data()[static_cast<std::size_t>(r) * vocab + pick(rng)] += lift(rng);
  DeviceBuffer logits(gpu, host_logits.size() * sizeof(float));
  gpu.copy_to_device(logits.data(), host_logits.data(), host_logits.size() * sizeof(float), Stream{});
  gpu.synchronize(Stream{});

  DeviceBuffer greedy_out(gpu, batch * sizeof(GreedyRow));
  HostArray<GreedyRow> greedy_host(gpu);
  greedy_host.resize(batch);
  DeviceBuffer rows(gpu, batch * sizeof(CandidateRow)), ids(gpu, std::size_t{1} * batch * k * sizeof(int32_t)),
      cand(gpu, std::size_t{1} * batch * k * sizeof(float)), inv_t(gpu, batch * sizeof(float));
  HostArray<CandidateRow> rows_host(gpu);
  HostArray<int32_t> ids_host(gpu);
  HostArray<float> cand_host(gpu), inv_t_host(gpu);
  rows_host.resize(batch);
  ids_host.resize(static_cast<std::size_t>(batch) * k);
  cand_host.resize(static_cast<std::size_t>(batch) * k);
  inv_t_host.resize(batch);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams top_p;
  top_p.temperature = 0.8f;
  top_p.top_p = 0.95f;
  top_p.seed = 1;
  for (int r = 0; r < batch; ++r) inv_t_host.data()[r] = 1.0f / top_p.temperature;
  gpu.copy_to_device(inv_t.data(), inv_t_host.data(), batch * sizeof(float), Stream{});
  gpu.synchronize(Stream{});

  const double greedy_device = seconds_per_call(steps, [&] {
    gpu.sample_greedy({logits.as<float>(), batch, vocab, greedy_out.as<GreedyRow>()}, Stream{});
    gpu.copy_to_host(greedy_host.data(), greedy_out.data(), batch * sizeof(GreedyRow), Stream{});
    gpu.synchronize(Stream{});
  });
  Sampler greedy_sampler(greedy, {}, 1);
  const double greedy_host_s = seconds_per_call(steps, [&] {
    for (int r = 0; r < batch; ++r) greedy_sampler.accept_greedy(greedy_host.data()[r]);
  });
  CandidateSampleParams cp;
  cp.logits = logits.as<float>();
  cp.num_rows = batch;
  cp.vocab_size = vocab;
  cp.inv_temperature = inv_t.as<float>();
  cp.num_candidates = k;
  cp.rows = rows.as<CandidateRow>();
  cp.ids = ids.as<int32_t>();
  cp.candidate_logits = cand.as<float>();
  const double top_p_device = seconds_per_call(steps, [&] {
    gpu.sample_candidates(cp, Stream{});
    gpu.copy_to_host(rows_host.data(), rows.data(), batch * sizeof(CandidateRow), Stream{});
    gpu.copy_to_host(ids_host.data(), ids.data(), ids_host.size() * sizeof(int32_t), Stream{});
    gpu.copy_to_host(cand_host.data(), cand.data(), cand_host.size() * sizeof(float), Stream{});
    gpu.synchronize(Stream{});
  });
  Sampler top_p_sampler(top_p, {}, 1);
  int declined = 0;
  const double top_p_host_s = seconds_per_call(steps, [&] {
    for (int r = 0; r < batch; ++r) {
      const auto at = static_cast<std::size_t>(r) * k;
      declined += !top_p_sampler.sample_candidates(rows_host.data()[r], {ids_host.data() + at, static_cast<std::size_t>(k)},
                                                   {cand_host.data() + at, static_cast<std::size_t>(k)}, vocab);
    }
  });
  // The old path: every row's logits back, sampled on the host.
  std::vector<float> row(static_cast<std::size_t>(vocab));
  const double copy_s = seconds_per_call(steps, [&] {
    gpu.copy_to_host(host_logits.data(), logits.data(), host_logits.size() * sizeof(float), Stream{});
    gpu.synchronize(Stream{});
  });
  const double host_top_p_s = seconds_per_call(std::max(1, steps / 10), [&] {
    for (int r = 0; r < batch; ++r) {
      std::copy_n(host_logits.data() + static_cast<std::size_t>(r) * vocab, vocab, row.begin());
      top_p_sampler.sample(row);
    }
  });
  std::printf("%-8s %10s %10s %10s %12s\n", "request", "device us", "host us", "step us", "host path us");
  std::printf("%-8s %10.1f %10.1f %10.1f %12.1f\n", "greedy", 1e6 * greedy_device, 1e6 * greedy_host_s,
              1e6 * (greedy_device + greedy_host_s), 1e6 * copy_s);
  std::printf("%-8s %10.1f %10.1f %10.1f %12.1f\n", "top-p", 1e6 * top_p_device, 1e6 * top_p_host_s,
              1e6 * (top_p_device + top_p_host_s), 1e6 * (copy_s + host_top_p_s));
  std::printf("top-p rows the candidates could not decide: %d of %d\n", declined, batch * (steps + 1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 200;
  int steps = 50;
  int batch = 64;
  std::string device;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) rows = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
    else if (std::strcmp(argv[i], "--batch") == 0 && i + 1 < argc) batch = std::max(1, std::atoi(argv[++i]));
    else if (std::strcmp(argv[i], "--quick") == 0) steps = 10;
  }
  if (!device.empty()) return run_device(device, steps, batch);
  std::printf("host sampling, one thread, %d rows per figure (the engine samples a step's rows in turn)\n", rows);
  std::printf("%-9s %-7s %-30s %12s %14s\n", "vocab", "logits", "request", "us / row", "KiB back / row");
  std::mt19937 rng(7);
  std::normal_distribution<float> logit(0.0f, 2.5f);
  const std::vector<int32_t> prompt(512, 11);
  for (const int vocab : {49152, 128256, 151936})  // SmolLM2, Llama 3, Qwen2/3
  for (const bool peaked : {true, false}) {
    std::vector<std::vector<float>> source(16, std::vector<float>(static_cast<std::size_t>(vocab)));
    std::uniform_int_distribution<int> pick(0, vocab - 1);
    std::uniform_real_distribution<float> lift(8.0f, 14.0f);
    for (auto& row : source) {
      for (float& v : row) v = peaked ? 0.8f * logit(rng) : logit(rng);
      if (peaked)
        for (int i = 0; i < 40; ++i) row[static_cast<std::size_t>(pick(rng))] += lift(rng);
    }
    for (const Kind& kind : kinds()) {
      Sampler sampler(kind.params, prompt, 1);
      std::vector<float> row(static_cast<std::size_t>(vocab));
      double total = 0.0;
      int32_t sink = 0;
      for (int r = 0; r < rows; ++r) {
        row = source[static_cast<std::size_t>(r) % source.size()];
        const auto t0 = std::chrono::steady_clock::now();
        sink ^= sampler.sample(row).token;
        total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      std::printf("%-9d %-7s %-30s %12.1f %14.0f%s\n", vocab, peaked ? "peaked" : "flat", kind.name,
                  1e6 * total / rows, vocab * 4.0 / 1024.0, sink == -1 ? "!" : "");
    }
  }
  return 0;
}
