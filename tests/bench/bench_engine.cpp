// bench_engine: the CPU engine end to end (scheduler, forward pass, sampling: the path the server
// runs), bf16 and FP8 weights (--quantization fp8) times bf16 and FP8 KV, each figure next to the
// machine limit it chases, all measured in this run with the same threads (issues 4 and 14).
//
//   bench_engine [MODEL] [--threads N] [--quick] [--weights bf16,fp8,fp8head] [--kv bf16,fp8]
//                [--window W [--window-tensors kv|k]] [--profile]
//
//   weights: bf16 as loaded; fp8 = --quantization fp8 (LM head bf16, the default); fp8head = and
//   --fp8-lm-head. KV: bf16, or FP8 without a window (fp8: --kv-rotation's default, hadamard;
//   fp8n: --kv-rotation none, what the rotation costs); --window adds fp8w, FP8 KV with a bf16
//   recent window of W tokens, to every weight dtype's rows.
//
//   machine        streaming read bandwidth (1 GiB) and fp32 FMA peak
//   load           peak RSS and time of loading the model and uploading its weights (a forked
//                  child, 16 MiB KV pool), per weight dtype
//   prefill        one 1000-token prompt (best of 3, prefix cache off): tokens/s, and GFLOP/s
//                  (projections + attention scores and sums) as a fraction of the FMA peak
//   decode b=1     64-token prompt + 128 tokens: tokens/s, and the bandwidth bound it implies:
//                  (weight bytes read per token + KV bytes read) / measured bandwidth
//   decode b=16    16 prompts of 64 tokens + 128 tokens each, decoded together: tokens/s and the
//                  ratio to batch 1
//   long decode    a 4000-token prompt + 64 tokens, batch 1: where FP8's half-size KV shows
//   --profile      where a batch-1 decode step's time goes, op by op (the forward pass driven
//                  directly on a timing backend), and what the engine adds around it
//
// Greedy decoding with ignore_eos, so every run produces the same number of tokens.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_inputs.hpp"
#include "child_process.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "machine_limits.hpp"
#include "model/loader.hpp"
#include "model/transformer.hpp"
#include "server/engine/engine.hpp"
#include "timing_backend.hpp"

using namespace fp8serve;

namespace {

// CPU seconds of this process (every thread) so far.
double process_cpu_s() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

struct RunTimes {
  double first_step_s = 0;  // the step that prefills every prompt and samples the first tokens
  double decode_s = 0;      // every later step
  double decode_cpu_s = 0;  // CPU seconds of every thread over those steps
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
  const double cpu1 = process_cpu_s();
  const int64_t after_first = generated;
  while (engine.has_work()) engine.step();
  r.first_step_s = t1 - t0;
  r.decode_s = bench::now_s() - t1;
  r.decode_cpu_s = process_cpu_s() - cpu1;
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
  double linear_rows = 0;              // their output channels (one FP8 scale each)
  double lm_head_params = 0;
  double vocab = 0;
  double kv_bytes_per_token_bf16 = 0;  // K + V, every layer
  // Every projection and the LM head are read once per decode step: 2 bytes a weight in bf16,
  // 1 in FP8 plus a 4-byte scale per row (the LM head too with --fp8-lm-head). The norms are
  // noise and the embedding table contributes one row (unless it is the tied head).
  double weight_bytes_per_decode_token(bool fp8, bool fp8_head = false) const {
    const double head = fp8 && fp8_head ? lm_head_params + 4 * vocab : 2 * lm_head_params;
    return (fp8 ? linear_params_per_token + 4 * linear_rows : 2 * linear_params_per_token) + head;
  }
};

Shape shape_of(const ModelConfig& c) {
  const double h = c.hidden_size, q = static_cast<double>(c.num_heads) * c.head_dim,
               kv = static_cast<double>(c.num_kv_heads) * c.head_dim, inter = c.intermediate_size;
  Shape s;
  s.linear_params_per_token = c.num_layers * (h * (2 * q + 2 * kv) + 3 * h * inter);
  s.linear_rows = c.num_layers * ((q + 2 * kv) + h + 2 * inter + h);
  s.vocab = c.vocab_size;
  s.lm_head_params = s.vocab * h;
  s.kv_bytes_per_token_bf16 = 2.0 * 2 * c.num_layers * kv;
  return s;
}

// Peak RSS (MiB) and seconds of loading the model and building an engine with a 16 MiB pool.
std::pair<double, double> load_footprint(const std::string& model_path, bool fp8, bool fp8_head, int threads) {
  std::istringstream in(bench::run_in_child([&] {
    const double t0 = bench::now_s();
    EngineOptions options;
    options.quantize_fp8 = fp8;
    options.quantize_lm_head = fp8_head;
    options.threads = threads;
    options.kv_cache_memory = 16u << 20;
    options.kv_bf16_window = 0;  // the load's footprint: no tail pool (64 rings would not fit in 16 MiB)
    options.max_num_batched_tokens = 512;
    options.max_model_len = 2048;
    Engine engine(load_model(model_path), options);
    const double seconds = bench::now_s() - t0;
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::ostringstream out;
    out << usage.ru_maxrss / 1024.0 << ' ' << seconds;
    return out.str();
  }));
  double rss = 0, seconds = 0;
  in >> rss >> seconds;
  return {rss, seconds};
}

// Batch-1 decode through the Transformer on a timing backend: per-op milliseconds per token, and
// the forward pass's wall time per token.
struct Profile {
  std::map<std::string, bench::TimingBackend::Total> ops;
  double forward_s = 0;
  int tokens = 0;
};

Profile profile_decode(const LoadedModel& model, int threads, bool fp8_weights, bool fp8_head, KvDtype kv,
                       KvRotation rotation, const std::vector<int32_t>& prompt, int gen) {
  cpu::ThreadPool pool(threads);
  cpu::CpuBackend cpu_backend(pool);
  bench::TimingBackend backend(cpu_backend);
  TransformerOptions options;
  options.kv_dtype = kv;
  options.kv_rotation = kv == KvDtype::fp8_e4m3 ? rotation : KvRotation::none;
  options.quantize_fp8 = fp8_weights;
  options.quantize_lm_head = fp8_head;
  options.max_model_len = static_cast<int>(prompt.size()) + gen + 16;
  options.num_blocks = (options.max_model_len + 15) / 16;
  options.max_num_tokens = static_cast<int>(prompt.size());
  options.max_num_seqs = 1;
  Transformer transformer(model.config, model.weights, backend, options);
  const auto layers = static_cast<std::size_t>(model.config.num_layers);
  std::vector<float> k_scales(layers, 1.0f), v_scales(layers, 1.0f);
  std::vector<float> logits(static_cast<std::size_t>(model.config.vocab_size));
  std::vector<int32_t> table(static_cast<std::size_t>(options.num_blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> ids = prompt;
  Profile profile;
  auto step = [&](int32_t begin, int32_t end, bool calibrate) {
    std::vector<int32_t> tokens(ids.begin() + begin, ids.begin() + end), positions(static_cast<std::size_t>(end - begin));
    std::iota(positions.begin(), positions.end(), begin);
    const std::vector<int64_t> slots(positions.begin(), positions.end());
    const std::vector<int32_t> qsl{0, end - begin}, context{end}, rows{end - begin - 1};
    const std::vector<uint8_t> cal{static_cast<uint8_t>(calibrate)};
    ForwardBatch b;
    b.token_ids = tokens;
    b.positions = positions;
    b.query_start_loc = qsl;
    b.context_lens = context;
    b.block_tables = table;
    b.max_blocks_per_seq = options.num_blocks;
    b.slot_mapping = slots;
    b.k_scales = k_scales;
    b.v_scales = v_scales;
    b.calibrate = cal;
    b.sample_rows = rows;
    transformer.forward(b, logits);
    ids.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  };
  step(0, static_cast<int32_t>(prompt.size()), true);
  backend.reset();
  const double t0 = bench::now_s();
  for (int i = 0; i < gen; ++i) step(static_cast<int32_t>(ids.size()) - 1, static_cast<int32_t>(ids.size()), false);
  profile.forward_s = bench::now_s() - t0;
  profile.ops = backend.totals();
  profile.tokens = gen;
  return profile;
}

// Projections for every token, the LM head for the one sampled row, and attention's two
// matrix products (scores and the weighted sum) over the causal context.
double prefill_flops(const ModelConfig& c, const Shape& s, double tokens) {
  const double attention = 4.0 * c.num_layers * c.num_heads * c.head_dim * tokens * (tokens + 1) / 2;
  return 2 * s.linear_params_per_token * tokens + 2 * s.lm_head_params + attention;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

void print_profile(const Profile& p, double step_s) {
  const double per_token = 1e3 / p.tokens;
  double ops_s = 0;
  std::printf("  %-22s %9s %7s %9s\n", "op", "ms/token", "%step", "GB/s");
  std::vector<std::pair<std::string, bench::TimingBackend::Total>> ops(p.ops.begin(), p.ops.end());
  std::sort(ops.begin(), ops.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  for (const auto& [name, t] : ops) {
    ops_s += t.seconds;
    char gbs[32] = "";
    if (name.rfind("linear ", 0) == 0) {
      // Bytes of the projection as stored: from its shape and the weight dtype of this run.
      const auto x = name.find('x');
      const double out = std::stod(name.substr(7, x - 7)), in = std::stod(name.substr(x + 1));
      const double calls_per_token = static_cast<double>(t.calls) / p.tokens;
      std::snprintf(gbs, sizeof gbs, "%.1f*", out * in * calls_per_token / (t.seconds / p.tokens) / 1e9);
    }
    std::printf("  %-22s %9.3f %6.1f%% %9s\n", name.c_str(), t.seconds * per_token, 100.0 * t.seconds / p.tokens / step_s,
                gbs);
  }
  const double forward = p.forward_s / p.tokens;
  std::printf("  %-22s %9.3f %6.1f%%\n", "forward, between ops", (p.forward_s - ops_s) * per_token,
              100.0 * (forward - ops_s / p.tokens) / step_s);
  std::printf("  %-22s %9.3f %6.1f%%   (engine step - forward: schedule, sampling, detokenize, outputs)\n",
              "engine around forward", 1e3 * (step_s - forward), 100.0 * (step_s - forward) / step_s);
  std::printf("  (* GB/s at 1 byte per weight: double it for bf16 weights)\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = bench::default_model_path();
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool quick = false, profile = false, bound_only = false;
  std::vector<std::string> weight_dtypes = {"bf16", "fp8"}, kv_dtypes = {"bf16", "fp8"};
  int window = 0;
  bool window_values = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--profile") {
      profile = true;
    } else if (arg == "--bound-only") {
      bound_only = true;
    } else if (arg == "--weights" && i + 1 < argc) {
      weight_dtypes = split(argv[++i]);
    } else if (arg == "--kv" && i + 1 < argc) {
      kv_dtypes = split(argv[++i]);
    } else if (arg == "--window" && i + 1 < argc) {
      window = std::stoi(argv[++i]);
    } else if (arg == "--window-tensors" && i + 1 < argc) {
      window_values = std::string(argv[++i]) == "kv";
    } else if (arg.rfind("--", 0) != 0) {
      model_path = arg;
    } else {
      std::fprintf(stderr, "usage: bench_engine [MODEL] [--threads N] [--quick] [--weights bf16,fp8,fp8head] [--kv bf16,fp8] "
                           "[--window W [--window-tensors kv|k]] [--profile]\n");
      return 2;
    }
  }
  if (window > 0) kv_dtypes.push_back("fp8w");
  if (!std::filesystem::exists(model_path)) {
    std::fprintf(stderr, "bench_engine: no model at %s (run .ci/fetch-model)\n", model_path.c_str());
    return 1;
  }

  if (bound_only) {
    // For load_bench.py: the measured read bandwidth and the weight bytes per decode token.
    cpu::ThreadPool pool(threads);
    const double bandwidth = bench::read_bandwidth(pool, std::size_t{1} << 30);
    const Shape shape = shape_of(load_model(model_path).config);
    std::printf("bandwidth_gbs=%.3f bf16_mb=%.3f fp8_mb=%.3f fp8_head_mb=%.3f\n", bandwidth / 1e9,
                shape.weight_bytes_per_decode_token(false) / 1e6, shape.weight_bytes_per_decode_token(true) / 1e6,
                shape.weight_bytes_per_decode_token(true, true) / 1e6);
    return 0;
  }
  std::printf("bench_engine: %s, %d threads, %s, projections %s\n", model_path.c_str(), threads,
              cpu::describe(cpu::cpu_features()).c_str(), cpu::linear_isa_name(cpu::LinearIsa::best));
  for (const std::string& w : weight_dtypes) {
    const auto [rss, seconds] = load_footprint(model_path, w != "bf16", w == "fp8head", threads);
    std::printf("load, %s weights: peak RSS %.0f MiB, %.2f s (model file mapped, weights uploaded, 16 MiB KV pool)\n",
                w.c_str(), rss, seconds);
  }

  double machine_bandwidth = 0, peak = 0;
  {
    cpu::ThreadPool pool(threads);
    machine_bandwidth = bench::read_bandwidth(pool, std::size_t{1} << 30);
    peak = bench::fma_peak(pool);
  }
  std::printf("machine: read bandwidth %.1f GB/s, fp32 FMA peak %.0f GFLOP/s\n", machine_bandwidth / 1e9, peak / 1e9);

  LoadedModel probe = load_model(model_path);
  const ModelConfig config = probe.config;
  const Shape shape = shape_of(config);
  const std::vector<int32_t> corpus =
      probe.tokenizer->encode(bench::read_texts(bench::default_text_files()), /*add_special_tokens=*/false);
  if (!profile) probe = LoadedModel{};
  std::printf("weights read per decode token: %.1f MB (bf16), %.1f MB (--quantization fp8, scales included), "
              "%.1f MB (and --fp8-lm-head)\n\n",
              shape.weight_bytes_per_decode_token(false) / 1e6, shape.weight_bytes_per_decode_token(true) / 1e6,
              shape.weight_bytes_per_decode_token(true, true) / 1e6);

  const int prefill_len = 1000, short_len = 64, gen = quick ? 32 : 128, batch = 16;
  const int long_len = quick ? 2000 : 4000, long_gen = quick ? 16 : 64;
  std::vector<std::vector<int32_t>> batch_prompts;
  for (int i = 0; i < batch; ++i) batch_prompts.push_back(take(corpus, 97 * i, short_len));

  std::printf("%-9s | %-26s | %-34s | %-22s | %s\n", "W / KV", "prefill 1000 tok", "decode b=1 (64 + 128)",
              "decode b=16", "decode b=1 at 4000");
  std::printf("%-9s | %8s %8s %7s | %8s %8s %7s %7s | %8s %6s %6s | %8s %8s\n", "", "tok/s", "GFLOP/s", "%peak",
              "tok/s", "ms/tok", "bound", "%bound", "tok/s", "x b=1", "", "tok/s", "ms/tok");
  std::map<std::string, double> step_ms;  // "W/KV" -> batch-1 ms per token
  struct IdleEstimate {
    std::string config;
    double step_s;
  };
  std::vector<IdleEstimate> idle_estimates;
  for (const std::string& w : weight_dtypes) {
    for (const std::string& kv : kv_dtypes) {
      const KvDtype dtype = kv == "bf16" ? KvDtype::bf16 : KvDtype::fp8_e4m3;
      EngineOptions options;
      options.kv_dtype = dtype;
      options.kv_bf16_window = kv == "fp8w" ? window : 0;  // the fp8 rows: the plain FP8 pool
      options.kv_bf16_window_values = window_values;
      options.kv_rotation = kv == "fp8n" ? KvRotation::none : kDefaultKvRotation;
      options.quantize_fp8 = w != "bf16";
      options.quantize_lm_head = w == "fp8head";
      options.threads = threads;
      options.enable_prefix_caching = false;  // every run computes its prompt
      options.max_num_batched_tokens = 4096;
      options.max_model_len = 8192;
      Engine engine(load_model(model_path), options);
      const double kv_bytes_per_token = shape.kv_bytes_per_token_bf16 * static_cast<double>(kv_dtype_size(dtype)) / 2.0;

      double prefill_s = 1e30;
      for (int rep = 0; rep < (quick ? 1 : 3); ++rep) {
        prefill_s = std::min(prefill_s, run(engine, {take(corpus, 11 * rep, prefill_len)}, 1,
                                            "prefill" + std::to_string(rep)).first_step_s);
      }
      const double prefill_gflops = prefill_flops(config, shape, prefill_len) / prefill_s / 1e9;

      // The bandwidth again right before the decode it bounds: on a shared machine it moves with
      // the neighbours' load, and the ratio should compare like with like.
      double local_bandwidth = 0;
      {
        cpu::ThreadPool pool(threads);
        local_bandwidth = bench::read_bandwidth(pool, std::size_t{256} << 20, 3);
      }
      const RunTimes one = run(engine, {take(corpus, 5, short_len)}, gen, "b1");
      const double one_tok_s = one.decode_tokens / one.decode_s;
      const double bandwidth = std::max(local_bandwidth, machine_bandwidth);
      // Bound: the weights plus the mean context's KV, read once per token at the measured rate
      // (the higher of the two measurements: the bound never flatters us).
      const double mean_context = short_len + gen / 2.0;
      const double bound_s =
          (shape.weight_bytes_per_decode_token(w != "bf16", w == "fp8head") + mean_context * kv_bytes_per_token) /
          bandwidth;
      const double step_s = one.decode_s / one.decode_tokens;
      step_ms[w + "/" + kv] = step_s;
      // On a shared machine the wall clock measures the neighbours too. Every thread of the pool
      // is busy through a decode step (working, or spinning between calls), so CPU seconds /
      // threads is what the step would take on an idle machine: an estimate, printed as one.
      const double idle_step_s = one.decode_cpu_s / threads / one.decode_tokens;
      idle_estimates.push_back({w + " / " + kv, idle_step_s});

      const RunTimes many = run(engine, batch_prompts, gen, "b16");
      const double many_tok_s = many.decode_tokens / many.decode_s;

      const RunTimes lng = run(engine, {take(corpus, 7, long_len)}, long_gen, "long");
      const double long_tok_s = lng.decode_tokens / lng.decode_s;

      char bw[16];
      std::snprintf(bw, sizeof bw, "%.0fGB/s", bandwidth / 1e9);
      std::printf("%-9s | %8.0f %8.1f %6.1f%% | %8.1f %8.2f %7.2f %6.1f%% | %8.1f %5.1fx %6s | %8.1f %8.2f\n",
                  (w + " / " + kv).c_str(), prefill_len / prefill_s, prefill_gflops, 100.0 * prefill_gflops * 1e9 / peak,
                  one_tok_s, 1e3 * step_s, 1e3 * bound_s, 100.0 * bound_s / step_s, many_tok_s, many_tok_s / one_tok_s,
                  bw, long_tok_s, 1e3 / long_tok_s);
      std::fflush(stdout);
    }
  }
  std::printf("\n%%bound = (weight + KV bytes per token / measured bandwidth) / measured time per token; the bandwidth\n"
              "(column before the long decode) is the higher of the start-of-run figure and one taken right before\n"
              "that row's batch-1 decode\n"
              "targets (issues 4, 14): b=1 decode >= 85%% of the bound; b=16 >= 8x b=1; FP8 KV no slower than bf16 at "
              "short contexts, faster at long ones\n");
  if (window > 0) std::printf("fp8w: FP8 KV with a bf16 window of %d tokens (%s)\n", window, window_values ? "K+V" : "K only");
  std::printf("\nbatch-1 decode at CPU time / %d threads (what an idle machine would take; the wall figures above "
              "include the neighbours):\n", threads);
  for (const IdleEstimate& e : idle_estimates) {
    std::printf("  %-11s %6.2f ms/token = %6.1f tok/s\n", e.config.c_str(), 1e3 * e.step_s, 1.0 / e.step_s);
  }

  if (profile) {
    for (const std::string& w : weight_dtypes) {
      // The last KV dtype asked for (the timing run has no window: fp8w profiles as fp8).
      const std::string kv = kv_dtypes.back() == "fp8w" ? "fp8" : kv_dtypes.back();
      const KvRotation rotation = kv == "fp8n" ? KvRotation::none : kDefaultKvRotation;
      const auto it = step_ms.find(w + "/" + kv);
      const Profile p = profile_decode(probe, threads, w != "bf16", w == "fp8head", kv == "bf16" ? KvDtype::bf16 : KvDtype::fp8_e4m3,
                                       rotation, take(corpus, 5, short_len), gen);
      const double step_s = it != step_ms.end() ? it->second : p.forward_s / p.tokens;
      std::printf("\nwhere a batch-1 decode step goes, %s weights, %s KV (64 + %d tokens; engine step %.2f ms, "
                  "forward %.2f ms):\n", w.c_str(), kv.c_str(), gen, 1e3 * step_s, 1e3 * p.forward_s / p.tokens);
      print_profile(p, step_s);
    }
  }
  return 0;
}
