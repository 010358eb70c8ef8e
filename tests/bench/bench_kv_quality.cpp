// bench_kv_quality: the seed's FP8-vs-bf16 table (issue 4), reproduced on this machine with the
// default model: bf16 KV against FP8 KV at several --kv-scale-margin values and bf16 recent
// windows (--kv-bf16-window, K and V or K only; issue 17), and, where the CPU attention runs on
// bf16 dot products, bf16 KV through the fp32 attention build. With --weights, the same for FP8
// weights (issue 14): bf16 weights against --quantization fp8 (LM head FP8 or bf16), the
// fp32-dot projections against the bf16 dot, and FP8 KV (the first of --windows) on top.
//
//   bench_kv_quality [MODEL] [--threads N] [--quick] [--margins 1,2,4] [--windows 0,32,64]
//                    [--window-tensors kv,k] [--text FILE]... [--weights] [--reference NAME]
//                    [--reference-only (only the third table)] [--rotations none,hadamard,hadamard-k]
//                    [--long-prompts N] [--only long|short]
//
// Workloads (prompts are token windows of natural English text, the repository's README and docs by
// default - they change as the docs do, so pin --text files to compare runs): N long prompts
// (1000 tokens each, spread evenly over the text; N = 6 by default) + 256 generated, decoded
// together, with each prompt's own mean KL; and 50 short prompts (20-100 tokens) + 128 generated
// each, decoded together as one batch of 50. --rotations: each FP8 configuration without and with
// --kv-rotation (hadamard-k: q and K only). The teacher-forced pass also counts the steps whose
// argmax is bf16's (greedy agreement without the compounding of a free run).
//
// Per KV configuration, two passes:
//   free run      greedy decoding, timed (wall, decode tokens/s), in a forked child so its peak
//                 RSS is its own; tokens compared with the bf16 run (matching prefix); the FP8
//                 saturation fraction counted by kv_write.
//   teacher-forced every FP8 configuration in lockstep with bf16, all fed the bf16 run's tokens,
//                 so divergence does not compound: KL(p_bf16 || p_fp8) of each next-token
//                 distribution, mean and max.
// With a transformers reference for the model (tests/fixtures/engine/NAME.kv-bf16[.act-bf16].json;
// NAME from --reference, else the model's file or folder name), a third table: each config's 32
// greedy tokens on the reference's prompts, and where they first differ, the reference's top-2
// margin there (a near-tie is < 0.01).
// It drives the Transformer directly (no scheduler): one sequence per contiguous run of blocks,
// the whole prompt set prefilled in one step, so the FP8 scales are calibrated on each full
// prompt, as the engine does with an unchunked prefill; with a window, sequence s owns tail
// ring s and its FP8 part follows the block manager's rule (KvWindow::fp8_len).
// Also printed: KV bytes per token of one sequence at 128 to 8k tokens of context (its FP8
// blocks plus its tail ring), what the window costs in memory.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_inputs.hpp"
#include "cache/kv_cache_spec.hpp"
#include "child_process.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "model/loader.hpp"
#include "model/transformer.hpp"

using namespace fp8serve;
using Clock = std::chrono::steady_clock;

namespace {

struct KvConfig {
  KvDtype dtype = KvDtype::bf16;
  float margin = 1.0f;
  cpu::CpuIsa attention_isa = cpu::CpuIsa::best;
  int window = 0;       // --kv-bf16-window
  bool values = true;   // K and V in the window (false: K only)
  bool fp8_weights = false;  // --quantization fp8
  bool fp8_lm_head = false;  // with it, the LM head too
  cpu::LinearIsa linear_isa = cpu::LinearIsa::best;
  KvRotation rotation = KvRotation::none;  // --kv-rotation
  bool rotate_values = true;               // with it, V too (false: K and q only)
  std::string name() const {
    char buf[64];
    if (dtype == KvDtype::bf16) std::snprintf(buf, sizeof buf, "bf16");
    else if (window == 0) std::snprintf(buf, sizeof buf, "fp8 m=%.1f", margin);
    else std::snprintf(buf, sizeof buf, "fp8 m=%.1f w=%d %s", margin, window, values ? "kv" : "k");
    std::string out = buf;
    if (rotation != KvRotation::none) out += rotate_values ? " rot" : " rot-k";
    if (attention_isa != cpu::CpuIsa::best) out += std::string(" ") + cpu::cpu_isa_name(attention_isa);
    if (fp8_weights) out = std::string("W fp8") + (fp8_lm_head ? " (LM head fp8)" : "") + ", KV " + out;
    if (linear_isa != cpu::LinearIsa::best) out += std::string(", projections ") + cpu::linear_isa_name(linear_isa);
    return out;
  }
};

// One model instance with its own pool, running S sequences in lockstep: prefill all, then one
// decode token per sequence per step.
class Stepper {
 public:
  Stepper(const LoadedModel& model, cpu::ThreadPool& pool, const KvConfig& kv,
          const std::vector<std::vector<int32_t>>& prompts, int num_generate)
      : config_(model.config), backend_(pool, kv.attention_isa, kv.linear_isa), prompts_(prompts) {
    const auto num_seqs = static_cast<int>(prompts.size());
    int max_prompt = 0, total_prompt = 0;
    for (const auto& p : prompts) {
      max_prompt = std::max(max_prompt, static_cast<int>(p.size()));
      total_prompt += static_cast<int>(p.size());
    }
    blocks_per_seq_ = (max_prompt + num_generate + kBlock - 1) / kBlock;
    TransformerOptions options;
    options.kv_dtype = kv.dtype;
    options.kv_scale_margin = kv.margin;
    options.block_size = kBlock;
    options.num_blocks = blocks_per_seq_ * num_seqs;
    options.max_num_tokens = std::max(total_prompt, num_seqs);
    options.max_num_seqs = num_seqs;
    options.max_model_len = blocks_per_seq_ * kBlock;
    options.quantize_fp8 = kv.fp8_weights;
    options.quantize_lm_head = kv.fp8_lm_head;
    options.window = KvWindow{kv.window, kv.values, kBlock};
    options.kv_rotation = kv.rotation;
    options.rotate_values = kv.rotate_values;
    window_ = options.window;
    transformer_ = std::make_unique<Transformer>(model.config, model.weights, backend_, options);
    const auto layers = static_cast<std::size_t>(config_.num_layers);
    k_scales_.assign(layers * static_cast<std::size_t>(num_seqs), 1.0f);
    v_scales_ = k_scales_;
    counts_.resize(layers);
    lengths_.assign(static_cast<std::size_t>(num_seqs), 0);
    num_fp8_.assign(static_cast<std::size_t>(num_seqs), 0);
    logits_.resize(static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(config_.vocab_size));
  }

  // Returns [num_seqs, vocab] logits of each sequence's next token.
  const std::vector<float>& prefill() {
    std::vector<std::vector<int32_t>> chunks = prompts_;
    run(chunks, true);
    return logits_;
  }
  const std::vector<float>& decode(const std::vector<int32_t>& tokens) {
    std::vector<std::vector<int32_t>> chunks;
    for (const int32_t t : tokens) chunks.push_back({t});
    run(chunks, false);
    return logits_;
  }
  uint64_t kv_bytes() const { return transformer_->kv_cache_bytes() + transformer_->tail_bytes(); }
  KvWriteCounts saturation() const {
    KvWriteCounts total;
    for (const KvWriteCounts& c : counts_) total += c;
    return total;
  }

 private:
  static constexpr int kBlock = 16;

  void run(const std::vector<std::vector<int32_t>>& chunks, bool calibrate) {
    const auto num_seqs = static_cast<int32_t>(chunks.size());
    std::vector<int32_t> ids, positions, qsl{0}, context, table, rows, fp8_lens, spill_starts, rings;
    std::vector<int64_t> slots;
    for (int32_t s = 0; s < num_seqs; ++s) {
      int32_t& len = lengths_[static_cast<std::size_t>(s)];
      for (const int32_t t : chunks[static_cast<std::size_t>(s)]) {
        ids.push_back(t);
        positions.push_back(len);
        slots.push_back(static_cast<int64_t>(s) * blocks_per_seq_ * kBlock + len);
        ++len;
      }
      qsl.push_back(static_cast<int32_t>(ids.size()));
      context.push_back(len);
      rows.push_back(static_cast<int32_t>(ids.size()) - 1);
      for (int b = 0; b < blocks_per_seq_; ++b) table.push_back(s * blocks_per_seq_ + b);
      if (window_.enabled()) {  // the block manager's rule (cache/block_manager.hpp)
        int32_t& num_fp8 = num_fp8_[static_cast<std::size_t>(s)];
        spill_starts.push_back(num_fp8);
        num_fp8 = std::max(num_fp8, window_.fp8_len(len));
        fp8_lens.push_back(num_fp8);
        rings.push_back(s);
      }
    }
    const std::vector<uint8_t> cal(static_cast<std::size_t>(num_seqs), calibrate ? 1 : 0);
    ForwardBatch batch;
    batch.token_ids = ids;
    batch.positions = positions;
    batch.query_start_loc = qsl;
    batch.context_lens = context;
    batch.block_tables = table;
    batch.max_blocks_per_seq = blocks_per_seq_;
    batch.slot_mapping = slots;
    batch.k_scales = k_scales_;
    batch.v_scales = v_scales_;
    batch.calibrate = cal;
    batch.sample_rows = rows;
    batch.fp8_lens = fp8_lens;
    batch.spill_starts = spill_starts;
    batch.tail_slots = rings;
    transformer_->forward(batch, logits_, counts_);
  }

  ModelConfig config_;
  cpu::CpuBackend backend_;
  std::vector<std::vector<int32_t>> prompts_;
  std::unique_ptr<Transformer> transformer_;
  int blocks_per_seq_ = 0;
  std::vector<float> k_scales_, v_scales_, logits_;
  std::vector<KvWriteCounts> counts_;
  std::vector<int32_t> lengths_;
  KvWindow window_;
  std::vector<int32_t> num_fp8_;  // per sequence: positions final in FP8
};

int32_t argmax(const float* row, int vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// KL(p || q) of softmax(a) and softmax(b), in double.
double kl_divergence(const float* a, const float* b, int vocab) {
  const double ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
  double za = 0, zb = 0;
  for (int i = 0; i < vocab; ++i) {
    za += std::exp(a[i] - ma);
    zb += std::exp(b[i] - mb);
  }
  const double la = std::log(za) + ma, lb = std::log(zb) + mb;
  double kl = 0;
  for (int i = 0; i < vocab; ++i) {
    const double lp = a[i] - la, lq = b[i] - lb;
    kl += std::exp(lp) * (lp - lq);
  }
  return std::max(0.0, kl);
}

struct FreeRun {
  double wall_s = 0, prefill_s = 0, decode_s = 0;
  uint64_t kv_bytes = 0;
  long peak_rss_kib = 0;
  uint64_t elements = 0, saturated = 0;
  std::vector<std::vector<int32_t>> tokens;  // [num_seqs, num_generate]
};

FreeRun free_run(const LoadedModel& model, cpu::ThreadPool& pool, const KvConfig& kv,
                 const std::vector<std::vector<int32_t>>& prompts, int num_generate) {
  FreeRun r;
  const Clock::time_point t0 = Clock::now();
  Stepper stepper(model, pool, kv, prompts, num_generate);
  const int vocab = model.config.vocab_size;
  const auto num_seqs = prompts.size();
  r.tokens.resize(num_seqs);
  const Clock::time_point t1 = Clock::now();
  const std::vector<float>* logits = &stepper.prefill();
  const Clock::time_point t2 = Clock::now();
  std::vector<int32_t> next(num_seqs);
  for (int step = 0; step < num_generate; ++step) {
    for (std::size_t s = 0; s < num_seqs; ++s) {
      next[s] = argmax(logits->data() + s * static_cast<std::size_t>(vocab), vocab);
      r.tokens[s].push_back(next[s]);
    }
    if (step + 1 < num_generate) logits = &stepper.decode(next);
  }
  const Clock::time_point t3 = Clock::now();
  r.prefill_s = std::chrono::duration<double>(t2 - t1).count();
  r.decode_s = std::chrono::duration<double>(t3 - t2).count();
  r.wall_s = std::chrono::duration<double>(t3 - t0).count();
  r.kv_bytes = stepper.kv_bytes();
  const KvWriteCounts sat = stepper.saturation();
  r.elements = sat.num_elements + sat.num_v_elements;  // quantized K and V
  r.saturated = sat.num_k_saturated + sat.num_v_saturated;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  r.peak_rss_kib = usage.ru_maxrss;
  return r;
}

// Runs free_run in a forked child (its own peak RSS), results back through a pipe.
FreeRun free_run_isolated(const LoadedModel& model, int threads, const KvConfig& kv,
                          const std::vector<std::vector<int32_t>>& prompts, int num_generate) {
  std::istringstream in(bench::run_in_child([&] {
    cpu::ThreadPool pool(threads);
    const FreeRun r = free_run(model, pool, kv, prompts, num_generate);
    std::ostringstream out;
    out.precision(17);
    out << r.wall_s << ' ' << r.prefill_s << ' ' << r.decode_s << ' ' << r.kv_bytes << ' ' << r.peak_rss_kib << ' '
        << r.elements << ' ' << r.saturated;
    for (const auto& seq : r.tokens)
      for (const int32_t t : seq) out << ' ' << t;
    return out.str();
  }));
  FreeRun r;
  in >> r.wall_s >> r.prefill_s >> r.decode_s >> r.kv_bytes >> r.peak_rss_kib >> r.elements >> r.saturated;
  r.tokens.assign(prompts.size(), std::vector<int32_t>(static_cast<std::size_t>(num_generate)));
  for (auto& seq : r.tokens)
    for (int32_t& t : seq) in >> t;
  return r;
}

struct Divergence {
  double mean_kl = 0, max_kl = 0;
  std::vector<double> per_seq;  // mean KL of each sequence
  uint64_t top1_same = 0, steps = 0;  // steps whose argmax is bf16's (fed the same tokens)
};

// Every other config in lockstep with the first (bf16), all fed its greedy tokens.
std::vector<Divergence> teacher_forced(const LoadedModel& model, cpu::ThreadPool& pool,
                                       const std::vector<KvConfig>& fp8, const std::vector<std::vector<int32_t>>& prompts,
                                       const std::vector<std::vector<int32_t>>& bf16_tokens, int num_generate) {
  const int vocab = model.config.vocab_size;
  const auto num_seqs = prompts.size();
  Stepper reference(model, pool, KvConfig{}, prompts, num_generate);
  std::vector<std::unique_ptr<Stepper>> runs;
  for (const KvConfig& kv : fp8) runs.push_back(std::make_unique<Stepper>(model, pool, kv, prompts, num_generate));
  std::vector<Divergence> result(fp8.size());
  for (Divergence& d : result) d.per_seq.assign(num_seqs, 0.0);
  std::vector<double> sum(fp8.size(), 0.0);
  uint64_t count = 0;
  std::vector<int32_t> forced(num_seqs);
  for (int step = 0; step < num_generate; ++step) {
    const std::vector<float>& p = step == 0 ? reference.prefill() : reference.decode(forced);
    for (std::size_t c = 0; c < runs.size(); ++c) {
      const std::vector<float>& q = step == 0 ? runs[c]->prefill() : runs[c]->decode(forced);
      for (std::size_t s = 0; s < num_seqs; ++s) {
        const double kl = kl_divergence(p.data() + s * vocab, q.data() + s * vocab, vocab);
        sum[c] += kl;
        result[c].per_seq[s] += kl / num_generate;
        result[c].top1_same += argmax(p.data() + s * vocab, vocab) == argmax(q.data() + s * vocab, vocab);
        ++result[c].steps;
        result[c].max_kl = std::max(result[c].max_kl, kl);
      }
    }
    count += num_seqs;
    for (std::size_t s = 0; s < num_seqs; ++s) forced[s] = bf16_tokens[s][static_cast<std::size_t>(step)];
  }
  for (std::size_t c = 0; c < runs.size(); ++c) result[c].mean_kl = sum[c] / static_cast<double>(count);
  return result;
}

struct Workload {
  std::string title;
  std::vector<std::vector<int32_t>> prompts;
  int num_generate = 0;
  std::vector<FreeRun> runs;  // per config
  bool per_prompt = false;    // print each prompt's KL too
};

// Free runs first, for every workload, while the parent process is still small: each forked
// child's peak RSS then counts only the parent's loaded model on top of its own allocations.
void run_free(const LoadedModel& model, int threads, const std::vector<KvConfig>& configs, Workload& w) {
  for (const KvConfig& kv : configs) w.runs.push_back(free_run_isolated(model, threads, kv, w.prompts, w.num_generate));
}

// Configurations run in lockstep with the bf16 reference per teacher-forced pass: each holds
// its own copy of the weights, so the passes go in groups (the reference reruns, identically).
constexpr std::size_t kLockstepGroup = 6;

void print_table(const LoadedModel& model, int threads, const std::vector<KvConfig>& configs, const Workload& w) {
  const auto& prompts = w.prompts;
  const auto& runs = w.runs;
  const int num_generate = w.num_generate;
  std::printf("\n## %s: %zu prompt(s) of %zu-%zu tokens, %d generated each\n\n", w.title.c_str(), prompts.size(),
              std::min_element(prompts.begin(), prompts.end(), [](auto& a, auto& b) { return a.size() < b.size(); })->size(),
              std::max_element(prompts.begin(), prompts.end(), [](auto& a, auto& b) { return a.size() < b.size(); })->size(),
              num_generate);
  std::vector<KvConfig> fp8(configs.begin() + 1, configs.end());
  cpu::ThreadPool pool(threads);
  std::vector<Divergence> kl;
  for (std::size_t first = 0; first < fp8.size(); first += kLockstepGroup) {
    const std::vector<KvConfig> group(fp8.begin() + static_cast<std::ptrdiff_t>(first),
                                      fp8.begin() + static_cast<std::ptrdiff_t>(std::min(fp8.size(), first + kLockstepGroup)));
    const std::vector<Divergence> part = teacher_forced(model, pool, group, prompts, runs[0].tokens, num_generate);
    kl.insert(kl.end(), part.begin(), part.end());
  }
  std::printf("| config | KV MiB (+ tail) | peak RSS MiB | wall s | prefill tok/s | decode tok/s | greedy tokens = bf16 | "
              "sequences all = bf16 | argmax = bf16, forced | mean KL | max KL | saturated |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::size_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += p.size();
  for (std::size_t c = 0; c < configs.size(); ++c) {
    const FreeRun& r = runs[c];
    std::size_t matched = 0, total = 0, all_match = 0;
    for (std::size_t s = 0; s < prompts.size(); ++s) {
      std::size_t i = 0;
      while (i < r.tokens[s].size() && r.tokens[s][i] == runs[0].tokens[s][i]) ++i;
      matched += i;
      total += r.tokens[s].size();
      if (i == r.tokens[s].size()) ++all_match;
    }
    const double decode_tokens = static_cast<double>(prompts.size()) * (num_generate - 1);
    char kl_mean[32] = "-", kl_max[32] = "-", top1[32] = "-";
    if (c > 0) {
      std::snprintf(top1, sizeof top1, "%llu/%llu", static_cast<unsigned long long>(kl[c - 1].top1_same),
                    static_cast<unsigned long long>(kl[c - 1].steps));
      std::snprintf(kl_mean, sizeof kl_mean, "%.2e", kl[c - 1].mean_kl);
      std::snprintf(kl_max, sizeof kl_max, "%.2e", kl[c - 1].max_kl);
    }
    std::printf("| %s | %.2f | %.0f | %.1f | %.0f | %.1f | %zu/%zu | %zu/%zu | %s | %s | %s | %.2e |\n",
                configs[c].name().c_str(), r.kv_bytes / 1048576.0, r.peak_rss_kib / 1024.0, r.wall_s,
                prompt_tokens / r.prefill_s, decode_tokens / r.decode_s, matched, total, all_match, prompts.size(),
                top1, kl_mean, kl_max, r.elements ? static_cast<double>(r.saturated) / r.elements : 0.0);
    std::fflush(stdout);
  }
  if (!w.per_prompt) return;
  // Each prompt's own mean KL: whether a change wins on every prompt, or on average only.
  std::printf("\n| config (mean KL per prompt) |");
  for (std::size_t s = 0; s < prompts.size(); ++s) std::printf(" %zu |", s + 1);
  std::printf("\n|---|");
  for (std::size_t s = 0; s < prompts.size(); ++s) std::printf("---|");
  std::printf("\n");
  for (std::size_t c = 1; c < configs.size(); ++c) {
    std::printf("| %s |", configs[c].name().c_str());
    for (const double v : kl[c - 1].per_seq) std::printf(" %.2e |", v);
    std::printf("\n");
  }
  std::fflush(stdout);
}

// Greedy tokens of every config on the prompts of a transformers reference, against it: the
// reference of the arithmetic the config runs (bf16 K/V; projections' inputs rounded to bf16 for
// the bf16 dot where that reference exists).
void print_reference(const LoadedModel& model, int threads, const std::vector<KvConfig>& configs,
                     const std::string& name) {
  const std::filesystem::path dir = bench::repo_root() / "tests/fixtures/engine";
  auto read = [](const std::filesystem::path& path) {
    std::ifstream in(path);
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  };
  const nlohmann::json fp32_dot = read(dir / (name + ".kv-bf16.json"));
  const nlohmann::json bf16_dot = read(dir / (name + ".kv-bf16.act-bf16.json"));
  if (fp32_dot.is_null()) {
    std::printf("\n(no transformers reference named %s: pass --reference NAME)\n", name.c_str());
    return;
  }
  std::printf("\n## greedy tokens against the transformers reference %s (%zu prompts x 32 tokens)\n\n", name.c_str(),
              fp32_dot["prompts"].size());
  std::printf("| config | reference | tokens = reference | prompts all = | first divergences: reference margin there |\n");
  std::printf("|---|---|---|---|---|\n");
  cpu::ThreadPool pool(threads);
  for (const KvConfig& config : configs) {
    const cpu::LinearIsa isa = config.linear_isa == cpu::LinearIsa::best ? cpu::linear_best_isa() : config.linear_isa;
    const bool rounded = isa == cpu::LinearIsa::avx512bf16 && !bf16_dot.is_null();
    const nlohmann::json& ref = rounded ? bf16_dot : fp32_dot;
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& p : ref["prompts"]) prompts.push_back(p["prompt_ids"].get<std::vector<int32_t>>());
    const FreeRun run = free_run(model, pool, config, prompts, 32);
    int matched = 0, all = 0;
    std::string margins;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      const auto expected = ref["prompts"][p]["greedy_ids"].get<std::vector<int32_t>>();
      std::size_t i = 0;
      while (i < expected.size() && run.tokens[p][i] == expected[i]) ++i;
      matched += static_cast<int>(i);
      if (i == expected.size()) {
        ++all;
        continue;
      }
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s%.3g@%zu", margins.empty() ? "" : ", ",
                    ref["prompts"][p]["greedy_steps"][i]["margin"].get<double>(), i);
      margins += buf;
    }
    std::printf("| %s | %s | %d/%zu | %d/%zu | %s |\n", config.name().c_str(),
                rounded ? "x rounded to bf16" : "fp32 projections", matched, 32 * prompts.size(), all, prompts.size(),
                margins.empty() ? "-" : margins.c_str());
    std::fflush(stdout);
  }
}

// KV bytes per token of one sequence at several context lengths: its FP8 (or bf16) blocks plus,
// with a window, its tail ring - what the window costs, next to pure FP8.
void print_memory_table(const ModelConfig& c, const std::vector<KvConfig>& configs) {
  const int contexts[] = {128, 1024, 4096, 8192};
  std::printf("\n## KV bytes per token of one sequence (its blocks of 16 + its tail ring), and / pure FP8\n\n");
  std::printf("| KV | tail ring | 128 | 1k | 4k | 8k |\n|---|---|---|---|---|---|\n");
  for (const KvConfig& kv : configs) {
    if (kv.attention_isa != cpu::CpuIsa::best || kv.fp8_weights || kv.linear_isa != cpu::LinearIsa::best) continue;
    KvCacheSpec spec{16, c.num_layers, c.num_kv_heads, c.head_dim, kv.dtype, KvWindow{kv.window, kv.values, 16}};
    KvCacheSpec fp8 = spec;
    fp8.dtype = KvDtype::fp8_e4m3;
    fp8.window = KvWindow{};
    const uint64_t ring = spec.tail_bytes(1);
    std::printf("| %s | %.0f KiB |", kv.name().c_str(), ring / 1024.0);
    for (const int n : contexts) {
      const uint64_t blocks = static_cast<uint64_t>((n + 15) / 16) * spec.bytes_per_block() + ring;
      const double per_token = static_cast<double>(blocks) / n;
      std::printf(" %.0f (%.3f) |", per_token, per_token / static_cast<double>(fp8.bytes_per_token()));
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = bench::default_model_path();
  std::vector<std::string> texts = bench::default_text_files();
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool quick = false, weights = false, reference_only = false;
  std::string reference;
  std::vector<float> margins = {1.0f, 2.0f, 4.0f};
  std::vector<int> windows = {0};
  std::vector<bool> tensors = {true};  // values in the window: kv = true, k = false
  // --rotations: none, hadamard (q, K, V), hadamard-k (q and K only)
  std::vector<std::pair<KvRotation, bool>> rotations = {{KvRotation::none, true}, {KvRotation::hadamard, true}};
  int num_long = -1;
  std::string only;  // --only long|short: one workload
  bool own_texts = false;
  auto list_of = [](const char* arg) {
    std::vector<std::string> items;
    std::stringstream list(arg);
    for (std::string item; std::getline(list, item, ',');) items.push_back(item);
    return items;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--weights") {
      weights = true;
    } else if (arg == "--reference-only") {
      reference_only = true;
    } else if (arg == "--reference" && i + 1 < argc) {
      reference = argv[++i];
    } else if (arg == "--text" && i + 1 < argc) {  // repeatable: the files, in order
      if (!own_texts) texts.clear();
      own_texts = true;
      texts.push_back(argv[++i]);
    } else if (arg == "--margins" && i + 1 < argc) {
      margins.clear();
      for (const std::string& m : list_of(argv[++i])) margins.push_back(std::stof(m));
    } else if (arg == "--windows" && i + 1 < argc) {
      windows.clear();
      for (const std::string& w : list_of(argv[++i])) windows.push_back(std::stoi(w));
    } else if (arg == "--window-tensors" && i + 1 < argc) {
      tensors.clear();
      for (const std::string& t : list_of(argv[++i])) tensors.push_back(t == "kv");
    } else if (arg == "--rotations" && i + 1 < argc) {
      rotations.clear();
      for (const std::string& r : list_of(argv[++i])) {
        if (r != "none" && r != "hadamard" && r != "hadamard-k") {
          std::fprintf(stderr, "--rotations: none, hadamard or hadamard-k, not %s\n", r.c_str());
          return 2;
        }
        rotations.emplace_back(r == "none" ? KvRotation::none : KvRotation::hadamard, r != "hadamard-k");
      }
    } else if (arg == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (arg == "--long-prompts" && i + 1 < argc) {
      num_long = std::stoi(argv[++i]);
    } else if (arg.rfind("--", 0) != 0) {
      model_path = arg;
    } else {
      std::fprintf(stderr, "usage: bench_kv_quality [MODEL] [--threads N] [--quick] [--margins 1,2,4] "
                           "[--windows 0,32,64] [--window-tensors kv,k] [--text FILE]... [--weights] "
                           "[--reference NAME] [--reference-only] [--rotations none,hadamard,hadamard-k] "
                           "[--long-prompts N] [--only long|short]\n");
      return 2;
    }
  }
  const LoadedModel model = load_model(model_path);
  const std::vector<int32_t> ids = model.tokenizer->encode(bench::read_texts(texts), false);

  const int long_len = quick ? 300 : 1000, long_gen = quick ? 64 : 256;
  if (num_long < 0) num_long = quick ? 2 : 6;
  if (num_long < 1) num_long = 1;
  const int num_short = quick ? 12 : 50, short_gen = quick ? 32 : 128;
  if (static_cast<int>(ids.size()) < long_len + 200) {
    std::fprintf(stderr, "the text has only %zu tokens; pass a longer --text\n", ids.size());
    return 2;
  }
  std::vector<KvConfig> configs{{KvDtype::bf16, 1.0f}};
  if (weights) {
    // FP8 weights: LM head FP8 and bf16; the bf16 dot's own cost (fp32-dot projections on bf16
    // weights); FP8 KV on top of FP8 weights and alone, at the default margin.
    const float m = margins.size() == 1 ? margins[0] : kDefaultKvScaleMargin;
    KvConfig w{KvDtype::bf16, 1.0f};
    w.fp8_weights = true;
    configs.push_back(w);
    w.fp8_lm_head = true;
    configs.push_back(w);
    if (cpu::linear_isa_supported(cpu::LinearIsa::avx512bf16)) {
      KvConfig fp32_dot{KvDtype::bf16, 1.0f};
      fp32_dot.linear_isa = cpu::LinearIsa::avx512;
      configs.push_back(fp32_dot);
    }
    for (const auto& [rotation, values] : rotations) {
      KvConfig fp8_kv{KvDtype::fp8_e4m3, m, cpu::CpuIsa::best, windows.front(), tensors.front()};
      fp8_kv.rotation = rotation;
      fp8_kv.rotate_values = values;
      configs.push_back(fp8_kv);
      KvConfig both = fp8_kv;
      both.fp8_weights = true;
      configs.push_back(both);
    }
  } else {
    // Where the default attention is the bf16 dot-product build, the fp32 one on the same bf16
    // KV as well: what the kernel's own rounding of q and p costs, next to what FP8 costs.
    if (cpu::resolve_cpu_isa(cpu::CpuIsa::best, model.config.head_dim) == cpu::CpuIsa::avx512bf16) {
      configs.push_back({KvDtype::bf16, 1.0f, cpu::CpuIsa::avx512});
    }
    for (const auto& [rotation, rotate_values] : rotations) {
      for (const float m : margins) {
        for (const int w : windows) {
          for (const bool values : tensors) {
            KvConfig kv{KvDtype::fp8_e4m3, m, cpu::CpuIsa::best, w, values};
            kv.rotation = rotation;
            kv.rotate_values = rotate_values;
            configs.push_back(kv);
            if (w == 0) break;  // no window: the tensors do not apply
          }
        }
      }
    }
  }
  if (reference.empty()) {
    const std::filesystem::path path(model_path);
    reference = path.stem() == "SmolLM2-135M-Instruct.Q4_1" ? "smollm2-135m-q4_1" : path.filename().string();
  }

  std::printf("# bench_kv_quality: %s, %d threads, %zu text tokens, projections %s\n", model.name.c_str(), threads,
              ids.size(), cpu::linear_isa_name(cpu::LinearIsa::best));
  std::printf("(peak RSS: of a forked child, after the parent loaded the model - its weights still in the mapped "
              "file - and the run uploaded them)\n");
  // Long prompts: num_long windows of long_len tokens spread evenly over the text (overlapping
  // where it is short), decoded together.
  std::vector<std::vector<int32_t>> long_prompts;
  const std::size_t long_stride = num_long > 1 ? (ids.size() - static_cast<std::size_t>(long_len)) / static_cast<std::size_t>(num_long - 1) : 0;
  for (int i = 0; i < num_long; ++i) {
    const auto begin = ids.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * long_stride);
    long_prompts.emplace_back(begin, begin + long_len);
  }
  Workload long_workload{"long prompts (one batch)", long_prompts, long_gen, {}, true};

  // Short prompts: windows of 20-100 tokens spread over the text.
  std::vector<std::vector<int32_t>> short_prompts;
  const std::size_t stride = (ids.size() - 100) / static_cast<std::size_t>(num_short);
  for (int i = 0; i < num_short; ++i) {
    const std::size_t len = 20 + static_cast<std::size_t>(i * 37 % 81);
    const auto begin = ids.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(i) * stride);
    short_prompts.emplace_back(begin, begin + static_cast<std::ptrdiff_t>(len));
  }
  Workload short_workload{"short prompts (one batch)", short_prompts, short_gen, {}};
  if (reference_only) {
    print_reference(model, threads, configs, reference);
    return 0;
  }
  print_memory_table(model.config, configs);
  std::fflush(stdout);
  const bool run_long = only != "short", run_short = only != "long";
  if (run_long) run_free(model, threads, configs, long_workload);
  if (run_short) run_free(model, threads, configs, short_workload);
  if (run_long) print_table(model, threads, configs, long_workload);
  if (run_short) print_table(model, threads, configs, short_workload);
  if (only.empty()) print_reference(model, threads, configs, reference);
  return 0;
}
