// bench_engine: the CPU engine end to end (scheduler, forward pass, sampling: the path the server
// runs), FP8 KV next to bf16 KV, each figure next to the machine limit it chases, all measured in
// this run with the same threads (issue 4's speed targets).
//
//   bench_engine [MODEL] [--threads N] [--quick] [--window W [--window-tensors kv|k]]
//
//   (--window adds a third row: FP8 KV with a bf16 recent window of W tokens; the FP8 row has none)
//
//   machine        streaming read bandwidth (1 GiB) and fp32 FMA peak
//   prefill        one 1000-token prompt (best of 3, prefix cache off): tokens/s, and GFLOP/s
//                  (projections + attention scores and sums) as a fraction of the FMA peak
//   decode b=1     64-token prompt + 128 tokens: tokens/s, and the bandwidth bound it implies:
//                  (weight bytes read per token + KV bytes read) / measured bandwidth
//   decode b=16    16 prompts of 64 tokens + 128 tokens each, decoded together: tokens/s and the
//                  ratio to batch 1
//   long decode    a 4000-token prompt + 64 tokens, batch 1: where FP8's half-size KV shows
//
// Greedy decoding with ignore_eos, so every run produces the same number of tokens.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_inputs.hpp"
#include "machine_limits.hpp"
#include "model/loader.hpp"
#include "server/engine.hpp"

using namespace fp8serve;

namespace {

struct RunTimes {
  double first_step_s = 0;  // the step that prefills every prompt and samples the first tokens
  double decode_s = 0;      // every later step
  int64_t decode_tokens = 0;
};

// Adds every prompt before the first step, so the first step is all prefill and every later one
// all decode; then steps until done.
RunTimes run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
             const std::string& tag) {
  int64_t generated = 0;
  std::string error;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest request;
    request.request_id = tag + "-" + std::to_string(i);
    request.prompt_tokens = prompts[i];
    request.max_tokens = max_tokens;
    request.sampling.temperature = 0.0f;
    request.ignore_eos = true;
    engine.add_request(std::move(request), [&](RequestOutput&& out) {
      generated += static_cast<int64_t>(out.new_tokens.size());
      if (out.finish && *out.finish == FinishReason::error) error = out.error;
    });
  }
  RunTimes r;
  const double t0 = bench::now_s();
  engine.step();
  const double t1 = bench::now_s();
  const int64_t after_first = generated;
  while (engine.has_work()) engine.step();
  r.first_step_s = t1 - t0;
  r.decode_s = bench::now_s() - t1;
  r.decode_tokens = generated - after_first;
  if (!error.empty()) throw std::runtime_error("bench_engine: request failed: " + error);
  if (after_first != static_cast<int64_t>(prompts.size())) {
    throw std::runtime_error("bench_engine: the first step did not prefill every prompt");
  }
  return r;
}

std::vector<int32_t> take(const std::vector<int32_t>& text, std::size_t offset, std::size_t n) {
  std::vector<int32_t> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(text[(offset + i) % text.size()]);
  return out;
}

struct Shape {
  double linear_params_per_token = 0;  // every projection, LM head excluded
  double lm_head_params = 0;
  double weight_bytes_per_decode_token = 0;
  double kv_bytes_per_token_bf16 = 0;  // K + V, every layer
};

Shape shape_of(const ModelConfig& c) {
  const double h = c.hidden_size, q = static_cast<double>(c.num_heads) * c.head_dim,
               kv = static_cast<double>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  Shape s;
  s.linear_params_per_token = c.num_layers * (h * (2 * q + 2 * kv) + 3 * h * inter);
  s.lm_head_params = static_cast<double>(c.vocab_size) * h;
  // bf16 weights: every projection and the LM head are read once per decode step; the norms
  // are noise and the embedding table contributes one row (unless it is the tied LM head).
  s.weight_bytes_per_decode_token = 2 * (s.linear_params_per_token + s.lm_head_params);
  s.kv_bytes_per_token_bf16 = 2.0 * 2 * c.num_layers * kv;
  return s;
}

// Projections for every token, the LM head for the one sampled row, and attention's two
// matrix products (scores and the weighted sum) over the causal context.
double prefill_flops(const ModelConfig& c, const Shape& s, double tokens) {
  const double attention = 4.0 * c.num_layers * c.num_heads * c.head_dim * tokens * (tokens + 1) / 2;
  return 2 * s.linear_params_per_token * tokens + 2 * s.lm_head_params + attention;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = bench::default_model_path();
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool quick = false;
  int window = 0;
  bool window_values = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--window" && i + 1 < argc) {
      window = std::stoi(argv[++i]);
    } else if (arg == "--window-tensors" && i + 1 < argc) {
      window_values = std::string(argv[++i]) == "kv";
    } else if (arg.rfind("--", 0) != 0) {
      model_path = arg;
    } else {
      std::fprintf(stderr, "usage: bench_engine [MODEL] [--threads N] [--quick] [--window W [--window-tensors kv|k]]\n");
      return 2;
    }
  }
  if (!std::filesystem::exists(model_path)) {
    std::fprintf(stderr, "bench_engine: no model at %s (run .ci/fetch-model)\n", model_path.c_str());
    return 1;
  }

  double bandwidth = 0, peak = 0;
  {
    cpu::ThreadPool pool(threads);
    bandwidth = bench::read_bandwidth(pool, std::size_t{1} << 30);
    peak = bench::fma_peak(pool);
  }
  std::printf("bench_engine: %s, %d threads, %s\n", model_path.c_str(), threads,
              cpu::describe(cpu::cpu_features()).c_str());
  std::printf("machine: read bandwidth %.1f GB/s, fp32 FMA peak %.0f GFLOP/s\n", bandwidth / 1e9,
              peak / 1e9);

  LoadedModel probe = load_model(model_path);
  const ModelConfig config = probe.config;
  const Shape shape = shape_of(config);
  const std::vector<int32_t> corpus =
      probe.tokenizer->encode(bench::read_texts(bench::default_text_files()), /*add_special_tokens=*/false);
  probe = LoadedModel{};
  std::printf("weights read per decode token: %.1f MB (bf16)\n\n",
              shape.weight_bytes_per_decode_token / 1e6);

  const int prefill_len = 1000, short_len = 64, gen = quick ? 32 : 128, batch = 16;
  const int long_len = quick ? 2000 : 4000, long_gen = quick ? 16 : 64;
  std::vector<std::vector<int32_t>> batch_prompts;
  for (int i = 0; i < batch; ++i) batch_prompts.push_back(take(corpus, 97 * i, short_len));

  std::printf("%-4s | %-26s | %-34s | %-22s | %s\n", "KV", "prefill 1000 tok",
              "decode b=1 (64 + 128)", "decode b=16", "decode b=1 at 4000");
  std::printf("%-4s | %8s %8s %7s | %8s %8s %7s %7s | %8s %6s %6s | %8s %8s\n", "", "tok/s",
              "GFLOP/s", "%peak", "tok/s", "ms/tok", "bound", "%bound", "tok/s", "x b=1", "", "tok/s",
              "ms/tok");
  struct Row {
    KvDtype dtype;
    int window;
  };
  std::vector<Row> rows{{KvDtype::bf16, 0}, {KvDtype::fp8_e4m3, 0}};
  if (window > 0) rows.push_back({KvDtype::fp8_e4m3, window});
  for (const Row& row : rows) {
    const KvDtype dtype = row.dtype;
    EngineOptions options;
    options.kv_dtype = dtype;
    options.kv_bf16_window = row.window;
    options.kv_bf16_window_values = window_values;
    options.threads = threads;
    options.enable_prefix_caching = false;  // every run computes its prompt
    options.max_num_batched_tokens = 4096;
    options.max_model_len = 8192;
    Engine engine(load_model(model_path), options);
    const double kv_bytes_per_token =
        shape.kv_bytes_per_token_bf16 * static_cast<double>(kv_dtype_size(dtype)) / 2.0;

    double prefill_s = 1e30;
    for (int rep = 0; rep < (quick ? 1 : 3); ++rep) {
      prefill_s = std::min(prefill_s, run(engine, {take(corpus, 11 * rep, prefill_len)}, 1,
                                          "prefill" + std::to_string(rep)).first_step_s);
    }
    const double prefill_gflops = prefill_flops(config, shape, prefill_len) / prefill_s / 1e9;

    const RunTimes one = run(engine, {take(corpus, 5, short_len)}, gen, "b1");
    const double one_tok_s = one.decode_tokens / one.decode_s;
    // Bound: the weights plus the mean context's KV, read once per token at the measured rate.
    const double mean_context = short_len + gen / 2.0;
    const double bound_s = (shape.weight_bytes_per_decode_token + mean_context * kv_bytes_per_token) / bandwidth;
    const double step_s = one.decode_s / one.decode_tokens;

    const RunTimes many = run(engine, batch_prompts, gen, "b16");
    const double many_tok_s = many.decode_tokens / many.decode_s;

    const RunTimes lng = run(engine, {take(corpus, 7, long_len)}, long_gen, "long");
    const double long_tok_s = lng.decode_tokens / lng.decode_s;

    const std::string name = dtype == KvDtype::bf16 ? "bf16" : row.window == 0 ? "fp8" : "fp8w";
    std::printf("%-4s | %8.0f %8.1f %6.1f%% | %8.1f %8.2f %7.2f %6.1f%% | %8.1f %5.1fx %6s | %8.1f %8.2f\n",
                name.c_str(), prefill_len / prefill_s, prefill_gflops,
                100.0 * prefill_gflops * 1e9 / peak, one_tok_s, 1e3 * step_s, 1e3 * bound_s,
                100.0 * bound_s / step_s, many_tok_s, many_tok_s / one_tok_s, "", long_tok_s,
                1e3 / long_tok_s);
    std::fflush(stdout);
  }
  if (window > 0) std::printf("\nfp8w: FP8 KV with a bf16 window of %d tokens (%s)\n", window, window_values ? "K+V" : "K only");
  std::printf("\n%%bound = (weight + KV bytes per token / measured bandwidth) / measured time per token\n"
              "targets (issue 4): b=1 decode >= 85%% of the bound; b=16 >= 8x b=1; FP8 decode no slower "
              "than bf16 at short contexts, faster at long ones\n");
  return 0;
}
