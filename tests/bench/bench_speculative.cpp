// bench_speculative: n-gram speculative decoding (issue 23) against plain decoding on the CPU
// engine, side by side in one run, on workloads written here: input-grounded ones (repeat or
// summarize a ~1,000-token document, re-emit a code file with a variable renamed, a JSON answer
// that copies fields from the prompt) and open-ended prompts, where there is little to look up.
//
//   bench_speculative [MODEL] [--threads N] [--k K] [--window W] [--reps R] [--clients C] [--quick]
//                     [--draft DRAFT_MODEL]
//   bench_speculative --dump-prompts FILE
//
//   --dump-prompts writes the workloads (name, grounded, max_tokens, the chat messages) as a JSON
//                  array and exits: compare_llama_spec.py sends this very text to both servers.
//   --draft        draft-model speculation instead of ngram. With the model as its own draft
//                  (every proposal its own argmax) the run measures what a draft step costs:
//                  per step, verify = spec step time - proposals x plain decode time (a draft
//                  pass costs a target decode here), so a smaller draft of relative cost c per
//                  token and acceptance a breaks even when (E(a) - verify/decode) / K = c, with
//                  E(a) = (1 - a^(K+1)) / (1 - a) tokens per step; printed for several a.
//
//   single stream  per prompt: decode tokens/s (first token to last, so the prefill is out) and
//                  the process's CPU seconds over that span (robust to a loaded machine),
//                  plain and ngram (K proposals), best of R alternating runs; the acceptance rate
//                  and the mean tokens per verification step. Greedy, the chat template's
//                  ChatML, stops at EOS or max_tokens; both runs produce the very same tokens
//                  (checked), so the ratio is a ratio of times.
//   C clients      C requests (the prompts in turn) submitted at once: generated tokens / wall
//                  time, plain and ngram with the default --speculative-disable-by-batch-size.
//
// The model is the default SmolLM2-135M, FP8 KV with a bf16 window of W tokens (K only; the
// server's default 64; 0 = none).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_inputs.hpp"
#include "model/loader.hpp"
#include "server/engine/engine.hpp"

using namespace fp8serve;

namespace {

using Clock = std::chrono::steady_clock;

// CPU seconds of this process (every thread) so far: on a machine shared with others the wall
// clock measures the neighbours too, while the pool's threads are busy (working or spinning)
// through a whole step, so CPU seconds / threads estimate the idle machine's time.
double process_cpu_s() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// A ~1,000-token report about a made-up town, written for this benchmark.
std::string document() {
  const char* const names[] = {"Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir", "Gingko", "Hazel", "Ironwood", "Juniper"};
  const char* const trades[] = {"bakery", "forge", "library", "ferry", "mill", "school", "clinic", "market", "quarry", "orchard"};
  std::string text = "Annual report of the town of Westmere\n\n";
  char line[1024];
  for (int i = 0; i < 10; ++i) {
    // snprintf rather than string concatenation: GCC 12's -Wrestrict misfires on long + chains.
    std::snprintf(line, sizeof line,
                  "Section %d: the %s on %s Street. The %s opened in %d and employs %d people. Last year it served %d "
                  "visitors, %d percent more than the year before. Its manager, %s Moreau, asked the council for a "
                  "new roof, two delivery carts and longer opening hours on market days. The council agreed to the "
                  "roof and deferred the rest to the spring budget, noting that the %s had priority for repairs.\n\n",
                  i + 1, trades[i], names[i], trades[i], 1890 + 7 * i, 12 + 5 * i, 3400 + 611 * i, 4 + i,
                  names[(i + 3) % 10], trades[(i + 1) % 10]);
    text += line;
  }
  return text;
}

std::string code_file() {
  return R"(#include <stdio.h>
#include <stdlib.h>

struct Item {
  int id;
  double price;
  int count;
};

static double stock_value(const struct Item* items, int n) {
  double count = 0.0;
  for (int i = 0; i < n; ++i) {
    count += items[i].price * items[i].count;
  }
  return count;
}

static int read_items(FILE* in, struct Item* items, int max_items) {
  int count = 0;
  while (count < max_items && fscanf(in, "%d %lf %d", &items[count].id, &items[count].price, &items[count].count) == 3) {
    ++count;
  }
  return count;
}

int main(void) {
  struct Item items[64];
  int count = read_items(stdin, items, 64);
  printf("%d items, stock value %.2f\n", count, stock_value(items, count));
  return count > 0 ? 0 : 1;
}
)";
}

struct Workload {
  std::string name;
  bool grounded;
  std::string prompt;
  int max_tokens;
};

std::vector<Workload> workloads() {
  const std::string doc = document();
  return {
      {"repeat document", true, "Repeat the following report exactly, word for word.\n\n" + doc, 256},
      {"summarize document", true, "Summarize the following report, section by section.\n\n" + doc, 200},
      {"rename in code", true,
       "Rename the local variable `count` to `total` in main only, and output the whole file.\n\n" + code_file(), 256},
      {"JSON from fields", true,
       "Here is a customer record.\nname: Margaret Hamilton\nemployer: MIT Instrumentation Laboratory\nrole: "
       "director of software engineering\ncity: Cambridge, Massachusetts\nproject: Apollo guidance computer\n"
       "year: 1969\n\nWrite it as a JSON object with the keys name, employer, role, city, project and year.",
       120},
      {"story", false, "Write a short story about a girl who finds a lost kitten in the rain.", 200},
      {"explain", false, "Explain to a child why the sky is blue and sunsets are red.", 200},
      {"advice", false, "Give me five tips for staying focused while studying.", 200},
  };
}

struct RunResult {
  std::vector<int32_t> tokens;
  double decode_s = 0;  // first token to last
  double decode_cpu_s = 0;  // the process's CPU seconds over the same span
  double wall_s = 0;
  SpecDecodeCounters counters;
};

std::vector<int32_t> chat_prompt(const Tokenizer& tokenizer, const std::string& user) {
  return tokenizer.encode("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n", false);
}

// Runs the requests to completion, all submitted at once.
std::vector<RunResult> run(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, const std::vector<int>& max_tokens,
                           double* wall_s = nullptr) {
  static int serial = 0;
  std::vector<RunResult> results(prompts.size());
  std::vector<Clock::time_point> first(prompts.size()), last(prompts.size());
  std::vector<double> first_cpu(prompts.size()), last_cpu(prompts.size());
  const SpecDecodeCounters before = engine.spec_decode();
  const auto start = Clock::now();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.request_id = std::to_string(serial++);
    r.prompt_tokens = prompts[i];
    r.sampling.temperature = 0.0f;
    r.max_tokens = max_tokens[i];
    engine.add_request(std::move(r), [&, i](RequestOutput&& out) {
      const auto now = Clock::now();
      const double cpu = process_cpu_s();
      if (results[i].tokens.empty()) first[i] = now, first_cpu[i] = cpu;
      last[i] = now;
      last_cpu[i] = cpu;
      results[i].tokens.insert(results[i].tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    });
  }
  while (engine.has_work()) engine.step();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (wall_s != nullptr) *wall_s = wall;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    results[i].decode_s = std::chrono::duration<double>(last[i] - first[i]).count();
    results[i].decode_cpu_s = last_cpu[i] - first_cpu[i];
    results[i].wall_s = wall;
  }
  const SpecDecodeCounters& after = engine.spec_decode();
  results[0].counters.num_drafts = after.num_drafts - before.num_drafts;
  results[0].counters.num_draft_tokens = after.num_draft_tokens - before.num_draft_tokens;
  results[0].counters.num_accepted_tokens = after.num_accepted_tokens - before.num_accepted_tokens;
  return results;
}

// The workloads as chat requests: the same user message chat_prompt() wraps.
int dump_prompts(const std::string& path) {
  nlohmann::json out = nlohmann::json::array();
  for (const Workload& w : workloads()) {
    out.push_back({{"name", w.name},
                   {"grounded", w.grounded},
                   {"max_tokens", w.max_tokens},
                   {"messages", {{{"role", "user"}, {"content", w.prompt}}}}});
  }
  std::ofstream file(path);
  file << out.dump(1) << '\n';
  if (!file) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path = bench::default_model_path();
  int threads = 0, k = 6, reps = 3, clients = 16, window = 64;
  std::string draft_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (arg == "--k" && i + 1 < argc) k = std::stoi(argv[++i]);
    else if (arg == "--window" && i + 1 < argc) window = std::stoi(argv[++i]);
    else if (arg == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (arg == "--clients" && i + 1 < argc) clients = std::stoi(argv[++i]);
    else if (arg == "--quick") reps = 1, clients = 4;
    else if (arg == "--draft" && i + 1 < argc) draft_path = argv[++i];
    else if (arg == "--dump-prompts" && i + 1 < argc) return dump_prompts(argv[++i]);
    else if (arg.rfind("--", 0) != 0) model_path = arg;
    else {
      std::fprintf(stderr, "usage: bench_speculative [MODEL] [--threads N] [--k K] [--window W] [--reps R] [--clients C] [--quick] [--draft MODEL]\n"
                           "       bench_speculative --dump-prompts FILE\n");
      return 2;
    }
  }
  EngineOptions plain_options;
  plain_options.threads = threads;
  plain_options.max_model_len = 4096;
  plain_options.kv_bf16_window = window;
  EngineOptions spec_options = plain_options;
  spec_options.num_speculative_tokens = k;
  spec_options.speculative_model = draft_path;
  const char* method = draft_path.empty() ? "ngram" : "draft";
  Engine plain(load_model(model_path), plain_options);
  Engine spec(load_model(model_path), spec_options);
  const Tokenizer& tokenizer = plain.tokenizer();

  if (draft_path.empty()) {
    std::printf("ngram speculation, K = %d, lookup %d-%d tokens, bf16 window %d, best of %d alternating runs, %s\n\n",
                k, spec_options.ngram.min_n, spec_options.ngram.max_n, window, reps, model_path.c_str());
  } else {
    std::printf("draft speculation (%s), K = %d, bf16 window %d, best of %d alternating runs, %s\n\n", draft_path.c_str(),
                k, window, reps, model_path.c_str());
  }
  std::printf("%-20s %7s %7s | %10s %10s %6s | %13s %6s | %9s %10s | %11s\n", "workload", "prompt", "tokens", "plain t/s",
              "spec t/s", "ratio", "CPU s plain/sp", "ratio", "accepted", "tok/step", "verify/dec");
  double verify_per_decode_sum = 0;
  double grounded_log = 0, open_log = 0, grounded_cpu_log = 0, open_cpu_log = 0;
  int num_grounded = 0, num_open = 0;
  std::vector<std::vector<int32_t>> all_prompts;
  std::vector<int> all_max;
  for (const Workload& w : workloads()) {
    const std::vector<std::vector<int32_t>> prompt{chat_prompt(tokenizer, w.prompt)};
    all_prompts.push_back(prompt[0]);
    all_max.push_back(w.max_tokens);
    double best_plain = 1e30, best_spec = 1e30, cpu_plain = 1e30, cpu_spec = 1e30;
    RunResult last_plain, last_spec;
    for (int rep = 0; rep < reps; ++rep) {
      last_plain = run(plain, prompt, {w.max_tokens})[0];
      last_spec = run(spec, prompt, {w.max_tokens})[0];
      best_plain = std::min(best_plain, last_plain.decode_s);
      best_spec = std::min(best_spec, last_spec.decode_s);
      cpu_plain = std::min(cpu_plain, last_plain.decode_cpu_s);
      cpu_spec = std::min(cpu_spec, last_spec.decode_cpu_s);
    }
    if (last_plain.tokens != last_spec.tokens) {
      std::fprintf(stderr, "%s: %s output differs from plain output\n", w.name.c_str(), method);
      return 1;
    }
    const double n = static_cast<double>(last_plain.tokens.size() - 1);
    const double ratio = best_plain / best_spec;
    const SpecDecodeCounters& c = last_spec.counters;
    const double acceptance = c.num_draft_tokens > 0 ? static_cast<double>(c.num_accepted_tokens) / c.num_draft_tokens : 0;
    // Tokens per forward pass: every token is produced by one step, a draft's step produces
    // 1 + accepted of them.
    const double steps = n + 1 - static_cast<double>(c.num_accepted_tokens);
    // A step's cost beyond its draft passes, in plain decode steps (meaningful with --draft and
    // a model drafting for itself: each of its passes costs about one plain decode step).
    const double decode_step = best_plain / n;
    const double per_draft = c.num_drafts > 0 ? static_cast<double>(c.num_draft_tokens) / c.num_drafts : 0;
    const double verify_per_decode = (best_spec / (steps - 1) - per_draft * decode_step) / decode_step;
    verify_per_decode_sum += verify_per_decode;
    std::printf("%-20s %7zu %7zu | %10.1f %10.1f %5.2fx | %6.2f %6.2f %5.2fx | %8.0f%% %10.2f | %11.2f\n", w.name.c_str(),
                prompt[0].size(), last_plain.tokens.size(), n / best_plain, n / best_spec, ratio, cpu_plain, cpu_spec,
                cpu_plain / cpu_spec, 100 * acceptance, (n + 1) / steps, verify_per_decode);
    (w.grounded ? grounded_log : open_log) += std::log(ratio);
    (w.grounded ? grounded_cpu_log : open_cpu_log) += std::log(cpu_plain / cpu_spec);
    ++(w.grounded ? num_grounded : num_open);
  }
  std::printf("\ngeometric mean speed-up, wall: input-grounded %.2fx, open-ended %.2fx; CPU time: %.2fx, %.2fx\n",
              std::exp(grounded_log / num_grounded), std::exp(open_log / num_open),
              std::exp(grounded_cpu_log / num_grounded), std::exp(open_cpu_log / num_open));
  if (!draft_path.empty()) {
    const double verify = verify_per_decode_sum / (num_grounded + num_open);
    std::printf("mean verify step = %.2f plain decode steps; a draft breaks even at a cost per token (relative to the "
                "target's decode) of:\n", verify);
    for (const double a : {0.5, 0.6, 0.7, 0.8, 0.9, 0.99}) {
      const double tokens_per_step = (1 - std::pow(a, k + 1)) / (1 - a);
      std::printf("  acceptance %.2f: %.1f tokens/step, break-even cost %.2f\n", a, tokens_per_step,
                  (tokens_per_step - verify) / k);
    }
  }

  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  for (int i = 0; i < clients; ++i) {
    prompts.push_back(all_prompts[static_cast<std::size_t>(i) % all_prompts.size()]);
    max_tokens.push_back(96);
  }
  double plain_s = 0, spec_s = 0;
  const auto a = run(plain, prompts, max_tokens, &plain_s);
  const auto b = run(spec, prompts, max_tokens, &spec_s);
  std::size_t tokens = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    tokens += a[i].tokens.size();
    if (a[i].tokens != b[i].tokens) {
      std::fprintf(stderr, "client %zu: %s output differs from plain output\n", i, method);
      return 1;
    }
  }
  std::printf("%d clients at once (96 tokens each, prefill included): plain %.1f tok/s, %s %.1f tok/s (%.2fx; "
              "speculation off above %d decoding sequences)\n",
              clients, tokens / plain_s, method, tokens / spec_s, plain_s / spec_s, spec_options.speculative_disable_by_batch_size);
  return 0;
}
