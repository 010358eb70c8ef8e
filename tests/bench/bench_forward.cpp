// bench_forward: the forward pass alone (no scheduler, no sampling) on a backend, for a model of
// a real architecture with random weights (tests/bench/random_model.hpp), FP8 KV next to bf16
// KV. Made for the GPU (issue 12's benchmark: Llama-3-8B shapes need no download), and runs on
// the CPU with a small shape.
//
//   bench_forward [--device cpu|cuda] [--shape llama3-8b|qwen3-8b|smollm2-135m] [--quick]
//                 [--threads N] [--kv-memory BYTES] [--fp8-linear] [--fp8-peak TFLOPS]
//
//   decode   steps of B sequences x 1 token at context C: tokens/s; batch 1 against the bound
//            (weight bytes + KV bytes read per step) / the backend's copy bandwidth
//   prefill  one prompt of L tokens in one step: tokens/s
//   fits     the largest batch of 8k-token sequences the KV budget holds, FP8 vs bf16
//   fp8-linear  (on CUDA, or with --fp8-linear) FP8-weight projections of Llama-3-8B's shapes
//            alone: GB/s against the copy bandwidth, TFLOP/s against the dense FP8 peak
//            (--fp8-peak, default H200 SXM's 1979): fp8_linear_bench.hpp
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/kv_cache_spec.hpp"
#include "model/transformer.hpp"
#include "fp8_linear_bench.hpp"
#include "random_model.hpp"
#include "machine_limits.hpp"
#include "server/engine/device_select.hpp"
#if FP8SERVE_WITH_CUDA
#include "kernels/cuda/device_runtime.hpp"
#endif

using namespace fp8serve;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A synthetic step: num_seqs sequences, each with `num_new` new tokens ending at context
// `context`, blocks laid out sequence after sequence.
HostBatch synthetic_step(const ModelConfig& c, int block_size, int num_seqs, int num_new, int context) {
  HostBatch h;
  const int max_blocks = (context + block_size - 1) / block_size;
  h.max_blocks_per_seq = max_blocks;
  h.query_start_loc.push_back(0);
  for (int s = 0; s < num_seqs; ++s) {
    for (int b = 0; b < max_blocks; ++b) h.block_tables.push_back(s * max_blocks + b);
    for (int i = 0; i < num_new; ++i) {
      const int pos = context - num_new + i;
      h.token_ids.push_back((s * 7919 + pos) % c.vocab_size);
      h.positions.push_back(pos);
      h.slot_mapping.push_back(static_cast<int64_t>(s * max_blocks + pos / block_size) * block_size + pos % block_size);
    }
    h.query_start_loc.push_back(static_cast<int32_t>(h.token_ids.size()));
    h.context_lens.push_back(context);
    h.sample_rows.push_back(static_cast<int32_t>(h.token_ids.size()) - 1);
    h.calibrate.push_back(0);
  }
  h.k_scales.assign(static_cast<std::size_t>(c.num_layers * num_seqs), 0.05f);
  h.v_scales = h.k_scales;
  return h;
}

// Mean seconds per forward() over enough repetitions to pass ~0.5 s (after one warm-up).
double time_step(Transformer& model, HostBatch& in, int min_reps) {
  std::vector<float> logits(in.sample_rows.size() * static_cast<std::size_t>(model.config().vocab_size));
  ForwardBatch b = in.view();
  model.forward(b, logits);
  int reps = 0;
  const double t0 = now_s();
  double elapsed = 0;
  do {
    model.forward(b, logits);
    ++reps;
    elapsed = now_s() - t0;
  } while (reps < min_reps || elapsed < 0.5);
  return elapsed / reps;
}

// The bandwidth a decode step's reads are bounded by: a 1 GiB stream read on the CPU, the
// device-to-device copy rate on a GPU.
double copy_bandwidth(Device& device) {
  if (device.kind == "cpu") return bench::read_bandwidth(*device.pool, std::size_t{1} << 30);
#if FP8SERVE_WITH_CUDA
  return cuda::measure_copy_bandwidth(0);
#else
  return 0.0;
#endif
}

// KV bytes for the "fits" line: 90% of what the device has free after the weights, else 4 GiB.
uint64_t kv_budget(const Backend& backend) {
  if (const std::optional<DeviceMemory> memory = backend.memory_info()) return memory->free / 10 * 9;
  return uint64_t{4} << 30;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cpu", shape = "smollm2-135m";
  bool quick = false, fp8_linear = false;
  double fp8_peak_tflops = 1979.0;
  int threads = 0;
  uint64_t kv_memory = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--device") device = value();
    else if (arg == "--shape") shape = value();
    else if (arg == "--threads") threads = std::stoi(value());
    else if (arg == "--kv-memory") kv_memory = std::stoull(value());
    else if (arg == "--quick") quick = true;
    else if (arg == "--fp8-linear") fp8_linear = true;
    else if (arg == "--fp8-peak") fp8_peak_tflops = std::stod(value());
    else {
      std::fprintf(stderr, "usage: bench_forward [--device cpu|cuda] [--shape NAME] [--quick] [--threads N] "
                           "[--kv-memory BYTES] [--fp8-linear] [--fp8-peak TFLOPS]\n");
      return 2;
    }
  }
  const ModelConfig config = bench::random_model_config(shape);
  Device ctx = make_device(device, threads);
  std::printf("bench_forward: %s, %s\n", shape.c_str(), ctx.backend->describe().c_str());
  const double t_gen = now_s();
  const ModelWeights weights = bench::random_model_weights(config);
  std::printf("random weights: %.1f GB bf16 in %.1f s\n", static_cast<double>(weights.num_bytes()) / 1e9,
              now_s() - t_gen);
  const double bandwidth = copy_bandwidth(ctx);
  std::printf("bandwidth: %.0f GB/s (%s, measured)\n\n", bandwidth / 1e9,
              ctx.kind == "cpu" ? "1 GiB stream read" : "device-to-device copy");
  // First: the projections alone need the device memory the models below take.
  if (fp8_linear || ctx.kind == "cuda") bench::bench_fp8_linear(*ctx.backend, bandwidth, fp8_peak_tflops, quick);

  const std::vector<int> batches = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32, 64};
  const std::vector<int> contexts = quick ? std::vector<int>{1024} : std::vector<int>{1024, 8192};
  const std::vector<int> prompts = quick ? std::vector<int>{1024} : std::vector<int>{1024, 8192};
  const int block_size = 16;
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_prompt = *std::max_element(prompts.begin(), prompts.end());

  std::printf("%-5s %-8s %6s %8s %10s %10s %8s\n", "KV", "phase", "batch", "context", "ms/step", "tok/s",
              "%bound");
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    KvCacheSpec spec;
    spec.block_size = block_size;
    spec.num_layers = config.num_layers;
    spec.num_kv_heads = config.num_kv_heads;
    spec.head_dim = config.head_dim;
    spec.dtype = dtype;
    TransformerOptions options;
    options.kv_dtype = dtype;
    options.block_size = block_size;
    options.max_num_tokens = max_prompt;
    options.max_num_seqs = max_batch;
    options.max_model_len = std::max(max_context, max_prompt);
    const int needed = std::max(max_batch * ((max_context + block_size - 1) / block_size),
                                (max_prompt + block_size - 1) / block_size);
    Transformer model(config, weights, *ctx.backend, options);
    const uint64_t budget = kv_memory > 0 ? kv_memory : kv_budget(*ctx.backend);  // before the pool
    model.allocate_kv_cache(needed);
    const char* name = dtype == KvDtype::bf16 ? "bf16" : "fp8";

    const double weight_bytes = static_cast<double>(model.weight_bytes());
    for (const int context : contexts) {
      for (const int batch : batches) {
        HostBatch in = synthetic_step(config, block_size, batch, 1, context);
        const double step_s = time_step(model, in, quick ? 3 : 10);
        const double bound_s = (weight_bytes + static_cast<double>(batch) * context * spec.bytes_per_token()) / bandwidth;
        std::printf("%-5s %-8s %6d %8d %10.3f %10.1f %7.1f%%\n", name, "decode", batch, context, 1e3 * step_s,
                    batch / step_s, 100.0 * bound_s / step_s);
        std::fflush(stdout);
      }
    }
    for (const int prompt : prompts) {
      HostBatch in = synthetic_step(config, block_size, 1, prompt, prompt);
      const double step_s = time_step(model, in, 2);
      std::printf("%-5s %-8s %6d %8d %10.3f %10.1f %8s\n", name, "prefill", 1, prompt, 1e3 * step_s, prompt / step_s,
                  "");
    }
    const int blocks = spec.num_blocks_for_budget(budget);
    std::printf("%-5s fits     %6d sequences of 8192 tokens in %.1f GiB of KV (%d bytes/token)\n", name,
                blocks / (8192 / block_size), static_cast<double>(budget) / (1u << 30),
                static_cast<int>(spec.bytes_per_token()));
  }
  return 0;
}
