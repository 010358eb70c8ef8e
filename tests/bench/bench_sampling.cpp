// bench_sampling: where sampling should run on a GPU server, decided by measurement. The CUDA
// backend returns only the sampled rows' logits (fp32, one row per sequence) and the host samples
// them (server/sampling.hpp, the same code as on the CPU). This prints, for the vocabularies of
// the families we serve, the host's time per row for each kind of request, and the bytes a row
// brings back over PCIe, so that a step's sampling cost can be set against its GPU time.
//
//   bench_sampling [--rows N]
//
// Two kinds of rows: "peaked", like a language model's next-token logits (a background of
// N(0, 2^2) and 40 candidates 8-14 above it: top-p 0.95 keeps tens of tokens), and "flat",
// N(0, 2.5^2) everywhere (top-p 0.95 keeps thousands: the worst case of the nucleus search).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "server/sampling.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  int rows = 200;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) rows = std::max(1, std::atoi(argv[++i]));
  }
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
