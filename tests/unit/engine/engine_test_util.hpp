#pragma once
// Shared pieces of the engine tests: the transformers reference files, an output collector and
// an engine built from a fixture model.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/linear.hpp"
#include "model/loader.hpp"
#include "model/transformer.hpp"
#include "server/engine/engine.hpp"
#if FP8SERVE_WITH_CUDA
#include "kernels/cuda/device_runtime.hpp"
#endif

namespace fp8serve::test {

// Whether --device cuda can run here (a GPU, or the emulated H200 of the *_emu tests); a [gpu]
// test returns at once without one, saying why.
inline bool have_cuda_device() {
#if FP8SERVE_WITH_CUDA
  if (cuda::device_count() > 0) return true;
#endif
  WARN("no CUDA build or no CUDA device: [gpu] test skipped");
  return false;
}

// ASan builds run ~10x slower: the tests shorten their loops there, never skip them.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

inline std::string fixture(const std::string& relative) { return std::string(FP8SERVE_FIXTURES_DIR) + "/" + relative; }
inline std::string default_model_path() {
  return std::string(FP8SERVE_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// tests/fixtures/reference/NAME.json: transformers with fp32 K/V.
inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream in(fixture("reference/" + name + ".json"));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// Whether the projections run the bf16 dot (x rounded to bf16 at every projection's input,
// kernels/cpu/linear.hpp): on CPUs with AVX512-BF16.
inline bool projections_round_to_bf16() { return cpu::linear_best_isa() == cpu::LinearIsa::avx512bf16; }

// tests/fixtures/engine/NAME.kv-bf16.json: transformers with K/V rounded to bf16 after RoPE,
// i.e. what fp8serve's bf16 pool stores (tests/scripts/make_engine_reference.py). Where the
// projections round their inputs to bf16 and NAME.kv-bf16.act-bf16.json exists, that one: the
// same computation with every projection's input rounded to bf16 (tests/scripts/
// make_fp8_fixtures.py, numpy checked against transformers), so the tests keep their tight
// tolerances on the arithmetic this CPU runs. The default model has no such file: the bf16
// rounding moves its logits far less than the random tiny models' (docs/cpu.md, "CPU projections").
inline nlohmann::json load_fixture_json(const std::string& relative) {
  std::ifstream in(fixture(relative));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}
inline bool has_act_bf16_reference(const std::string& name) {
  return std::ifstream(fixture("engine/" + name + ".kv-bf16.act-bf16.json")).good();
}
inline nlohmann::json load_kv_bf16_reference(const std::string& name) {
  if (projections_round_to_bf16() && has_act_bf16_reference(name)) {
    return load_fixture_json("engine/" + name + ".kv-bf16.act-bf16.json");
  }
  return load_fixture_json("engine/" + name + ".kv-bf16.json");
}

struct Choice {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each chosen token, when asked for
  std::string text;
  std::optional<FinishReason> finish;
  std::string error;
};

// request id -> choices (index), filled on the engine thread (here: the test's own thread).
using Outputs = std::map<std::string, std::map<int, Choice>>;

inline OutputSink collect(Outputs& outputs) {
  return [&outputs](RequestOutput&& out) {
    Choice& c = outputs[out.request_id][out.index];
    c.tokens.insert(c.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    for (const SampleResult& s : out.logprobs) c.logprobs.push_back(s.logprob);
    c.text += out.text_delta;
    if (out.finish) {
      REQUIRE_FALSE(c.finish.has_value());  // exactly one final output per choice
      c.finish = out.finish;
      c.error = out.error;
    }
  };
}

inline GenerationRequest greedy_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.num_logprobs = 0;  // the chosen token's logprob: a bitwise witness of the logits
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

inline void run_to_completion(Engine& engine, int max_steps = 100000) {
  for (int i = 0; i < max_steps && engine.has_work(); ++i) engine.step();
  REQUIRE_FALSE(engine.has_work());
}

inline EngineOptions small_options(KvDtype dtype) {
  EngineOptions o;
  o.kv_dtype = dtype;
  o.kv_scale_margin = 1.0f;
  o.kv_cache_memory = 4u << 20;
  o.max_model_len = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 512;
  o.enable_prefix_caching = false;
  o.kv_bf16_window = 0;  // the plain FP8 pool; test_bf16_window.cpp runs the window
  o.threads = 2;
  return o;
}

inline std::unique_ptr<Engine> make_engine(const std::string& path, const EngineOptions& options) {
  spdlog::set_level(spdlog::level::warn);
  return std::make_unique<Engine>(load_model(path), options);
}

inline std::vector<int32_t> ids_of(const nlohmann::json& array) { return array.get<std::vector<int32_t>>(); }

struct PrefillResult {
  std::vector<float> logits;  // [vocab] at the last prompt position
  std::vector<KvWriteCounts> counts;
  std::vector<float> k_scales;  // [num_layers]
};

// One sequence, one prefill chunk straight through a Transformer on the CPU backend (the
// projections on `linear_isa`): last-position logits, saturation counts and calibrated scales.
inline PrefillResult prefill(const LoadedModel& model, const std::vector<int32_t>& prompt, KvDtype dtype,
                             cpu::LinearIsa linear_isa = cpu::LinearIsa::best, bool quantize_fp8 = false,
                             KvRotation rotation = KvRotation::none, bool rotate_values = true) {
  cpu::ThreadPool pool(2);
  cpu::CpuBackend backend(pool, cpu::CpuIsa::best, linear_isa);
  TransformerOptions options;
  options.kv_dtype = dtype;
  options.block_size = 16;
  options.max_model_len = 256;
  options.num_blocks = 16;
  options.max_num_tokens = 256;
  options.max_num_seqs = 4;
  options.quantize_fp8 = quantize_fp8;
  options.kv_rotation = rotation;
  options.rotate_values = rotate_values;
  Transformer transformer(model.config, model.weights, backend, options);

  const auto n = static_cast<int32_t>(prompt.size());
  const int32_t num_blocks = (n + 15) / 16;
  std::vector<int32_t> positions(prompt.size()), table(static_cast<std::size_t>(num_blocks));
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int64_t> slots(positions.begin(), positions.end());
  const std::vector<int32_t> qsl{0, n}, context{n}, rows{n - 1};
  const std::vector<uint8_t> calibrate{1};
  const auto layers = static_cast<std::size_t>(model.config.num_layers);
  PrefillResult result;
  result.k_scales.assign(layers, 1.0f);
  std::vector<float> v_scales(layers, 1.0f);
  result.logits.resize(static_cast<std::size_t>(model.config.vocab_size));
  result.counts.resize(layers);

  ForwardBatch batch;
  batch.token_ids = prompt;
  batch.positions = positions;
  batch.query_start_loc = qsl;
  batch.context_lens = context;
  batch.block_tables = table;
  batch.max_blocks_per_seq = num_blocks;
  batch.slot_mapping = slots;
  batch.k_scales = result.k_scales;
  batch.v_scales = v_scales;
  batch.calibrate = calibrate;
  batch.sample_rows = rows;
  transformer.forward(batch, result.logits, result.counts);
  return result;
}

// Our last-position logits against a reference file's last_logits (top-20 and checksums).
struct Agreement {
  double max_abs_error = 0;   // over the reference's top-20
  double cosine = 0;          // of the top-20 logits
  double checksum_rel = 0;    // worst relative error of sum, sum_sq, weighted_sum
  bool same_argmax = false;
};

inline Agreement compare(const std::vector<float>& ours, const nlohmann::json& last) {
  Agreement a;
  const auto ids = last["top_ids"].get<std::vector<int>>();
  const auto values = last["top_values"].get<std::vector<double>>();
  double dot = 0, nr = 0, no = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const double o = ours[static_cast<std::size_t>(ids[i])];
    a.max_abs_error = std::max(a.max_abs_error, std::abs(o - values[i]));
    dot += o * values[i];
    nr += values[i] * values[i];
    no += o * o;
  }
  a.cosine = dot / std::sqrt(nr * no);
  double sum = 0, sum_sq = 0, weighted = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    sum += ours[i];
    sum_sq += static_cast<double>(ours[i]) * ours[i];
    weighted += ours[i] * static_cast<double>((i % 7) + 1);
  }
  const nlohmann::json& c = last["checksum"];
  auto rel = [](double x, double ref) { return std::abs(x - ref) / std::max(1.0, std::abs(ref)); };
  a.checksum_rel = std::max({rel(sum, c["sum"].get<double>()), rel(sum_sq, c["sum_sq"].get<double>()),
                             rel(weighted, c["weighted_sum"].get<double>())});
  const auto best = std::max_element(ours.begin(), ours.end()) - ours.begin();
  a.same_argmax = best == ids[0];
  return a;
}

// Eight prompts of different lengths (3 to 125 tokens) cut from tiny Llama's fixture prompts.
inline std::vector<std::vector<int32_t>> eight_prompts() {
  const nlohmann::json ref = load_reference("tiny-llama");
  std::vector<int32_t> pool;
  for (const auto& p : ref["prompts"]) {
    const auto ids = ids_of(p["prompt_ids"]);
    pool.insert(pool.end(), ids.begin(), ids.end());
  }
  const int lengths[8] = {125, 3, 17, 40, 64, 90, 110, 7};
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    const auto begin = pool.begin() + 11 * i;
    prompts.emplace_back(begin, begin + lengths[i]);
  }
  return prompts;
}

// One greedy request alone in a fresh engine.
inline Choice run_alone(const std::string& model, const EngineOptions& options, const std::vector<int32_t>& prompt,
                        int max_tokens) {
  auto engine = make_engine(model, options);
  Outputs out;
  engine->add_request(greedy_request("alone", prompt, max_tokens), collect(out));
  run_to_completion(*engine);
  return out.at("alone").at(0);
}

}  // namespace fp8serve::test
