// bench_grammar: structured outputs' costs against the decode step they ride on (issue 16's
// targets: mask time per step under 5% of the step at batch 1 and 16, compile under 50 ms).
//
//   bench_grammar [--vocab smollm2|qwen3] [--engine] [--threads N] [--per-schema]
//
//   vocabulary   building the token trie for the model's vocabulary (once per server)
//   compile      each of the 50 fixture schemas: JSON Schema -> grammar -> DFAs (median, max)
//   masks        the tokenizer's own tokenization of every valid fixture instance replayed
//                through the matcher: time per mask, first use of a compiled schema (cold:
//                the (rule, state) classifications are computed on the way) and again (warm)
//   closing      the max_tokens rule (fewest tokens to the end, ClosingGraph): each fixture
//                instance replayed with room in the budget (the per-token check's fast path) and
//                with a budget of exactly its own length (searches in tokens at every step),
//                on a fresh grammar (cold) and again (warm); the budget mask a refused token
//                costs; the fewest tokens against the fewest bytes of a document
//   engine       (--engine) the real engine on SmolLM2: decode steps at batch 1 and batch 16,
//                free and constrained to schemas, side by side; the mask time the engine
//                measured per sequence-step next to the step time, and the budget checks' time,
//                also at a max_tokens of 16 that makes most documents close early
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_inputs.hpp"
#include "model/formats/gguf.hpp"
#include "model/loader.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "server/engine/engine.hpp"
#include "server/grammar/json_schema.hpp"
#include "server/grammar/matcher.hpp"

using namespace fp8serve;
using namespace fp8serve::grammar;
using Json = nlohmann::ordered_json;

namespace {

using GrammarPtrLike = std::shared_ptr<const CompiledGrammar>;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

Json fixture_schemas() {
  std::ifstream in(bench::repo_root() / "tests/fixtures/grammar/schemas.json");
  if (!in) throw std::runtime_error("tests/fixtures/grammar/schemas.json is missing");
  return Json::parse(in);
}

struct Loaded {
  std::unique_ptr<Tokenizer> tokenizer;
  std::shared_ptr<const TokenVocabulary> vocab;
};

Loaded load_vocab(const std::string& which) {
  Loaded l;
  if (which == "qwen3") {
    l.tokenizer = load_tokenizer_dir(bench::repo_root() / ".models/qwen3-tokenizer");
  } else {
    l.tokenizer = from_gguf(GgufFile::open(bench::default_model_path()));
  }
  const double t0 = now_s();
  l.vocab = TokenVocabulary::from_tokenizer(*l.tokenizer, l.tokenizer->vocab_size(), {*l.tokenizer->eos_id()});
  std::printf("vocabulary   %s: %d tokens (%d usable), trie of %zu nodes, built in %.1f ms\n", which.c_str(),
              l.vocab->mask_size(), l.vocab->num_usable(), l.vocab->trie().nodes.size(), (now_s() - t0) * 1e3);
  return l;
}

void bench_masks(const Loaded& l, const Json& cases) {
  std::vector<double> compile_ms;
  std::vector<double> cold_us, warm_us;
  std::vector<uint64_t> mask(static_cast<size_t>(l.vocab->mask_words()));
  int64_t classified = 0;
  for (const Json& c : cases) {
    const double t0 = now_s();
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(c["schema"]), l.vocab);
    compile_ms.push_back((now_s() - t0) * 1e3);
    for (int pass = 0; pass < 2; ++pass) {
      for (const Json& text : c["valid"]) {
        const std::vector<int32_t> ids = l.tokenizer->encode(text.get<std::string>(), false);
        GrammarMatcher m(g);
        for (const int32_t id : ids) {
          const double s = now_s();
          m.fill_next_token_bitmask(mask);
          (pass == 0 ? cold_us : warm_us).push_back((now_s() - s) * 1e6);
          if (!m.accept_token(id)) throw std::runtime_error("bench_grammar: a fixture instance was rejected");
        }
      }
    }
    classified += g->cache_stats().num_classified;
  }
  std::printf("compile      50 schemas: median %.2f ms, p90 %.2f ms, max %.2f ms (target < 50 ms)\n", percentile(compile_ms, 0.5),
              percentile(compile_ms, 0.9), percentile(compile_ms, 1.0));
  std::printf("masks cold   %zu masks: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us (%lld (rule, state) classifications)\n",
              cold_us.size(), mean(cold_us), percentile(cold_us, 0.5), percentile(cold_us, 0.99), percentile(cold_us, 1.0),
              static_cast<long long>(classified));
  std::printf("masks warm   %zu masks: mean %.1f us, p50 %.1f us, p99 %.1f us, max %.1f us\n", warm_us.size(), mean(warm_us),
              percentile(warm_us, 0.5), percentile(warm_us, 0.99), percentile(warm_us, 1.0));

  // Applying a mask to the logits: a sparse one (between keys) and a dense one (inside a string).
  {
    auto g = std::make_shared<const CompiledGrammar>(json_object_grammar(), l.vocab);
    std::vector<float> logits(static_cast<size_t>(l.vocab->mask_size()), 1.0f);
    for (const char* prefix : {"{", "{\"ab"}) {
      GrammarMatcher m(g);
      m.accept_bytes(prefix);
      m.fill_next_token_bitmask(mask);
      const double t0 = now_s();
      for (int i = 0; i < 1000; ++i) apply_token_bitmask(mask, logits);
      std::printf("apply        %s mask (%lld tokens allowed): %.1f us per %d logits\n", prefix[1] ? "dense" : "sparse",
                  static_cast<long long>(bitmask_count(mask)), (now_s() - t0) * 1e3, l.vocab->mask_size());
    }
  }

  // json_object mode: arbitrary JSON objects.
  auto any = std::make_shared<const CompiledGrammar>(json_object_grammar(), l.vocab);
  std::vector<double> any_us;
  for (int pass = 0; pass < 2; ++pass)
    for (const Json& c : cases)
      for (const Json& text : c["valid"]) {
        if (text.get<std::string>().front() != '{') continue;
        const std::vector<int32_t> ids = l.tokenizer->encode(text.get<std::string>(), false);
        GrammarMatcher m(any);
        for (const int32_t id : ids) {
          const double s = now_s();
          m.fill_next_token_bitmask(mask);
          if (pass == 1) any_us.push_back((now_s() - s) * 1e6);
          if (!m.accept_token(id)) throw std::runtime_error("bench_grammar: json_object rejected a fixture instance");
        }
      }
  std::printf("json_object  %zu masks (warm): mean %.1f us, p50 %.1f us, p99 %.1f us\n", any_us.size(), mean(any_us),
              percentile(any_us, 0.5), percentile(any_us, 0.99));
}

void print_times(const char* what, const std::vector<double>& us) {
  std::printf("%s %zu: mean %.2f us, p50 %.2f us, p99 %.1f us, max %.1f us\n", what, us.size(), mean(us), percentile(us, 0.5),
              percentile(us, 0.99), percentile(us, 1.0));
}

void bench_closing(const Loaded& l, const Json& cases, bool per_schema) {
  std::vector<double> roomy_us, cold_us, warm_us, mask_cold_us, mask_warm_us, ratio;
  std::vector<uint64_t> mask(static_cast<size_t>(l.vocab->mask_words()));
  ClosingGraph::Stats total;
  for (const Json& c : cases) {
    auto g = std::make_shared<const CompiledGrammar>(json_schema_grammar(c["schema"]), l.vocab);
    for (int pass = 0; pass < 3; ++pass) {  // roomy, tight cold, tight warm
      for (const Json& text : c["valid"]) {
        const std::vector<int32_t> ids = l.tokenizer->encode(text.get<std::string>(), false);
        const auto n = static_cast<int64_t>(ids.size());
        GrammarMatcher m(g);
        if (pass == 1 && &text == &c["valid"].front()) {
          const int64_t fewest = m.tokens_to_end(1000);
          if (fewest > 0) ratio.push_back(static_cast<double>(fewest) / static_cast<double>(m.bytes_to_end()));
        }
        for (int64_t i = 0; i < n; ++i) {
          const int32_t id = ids[static_cast<size_t>(i)];
          const int64_t left = (pass == 0 ? n + 100 : n) - i;  // this token included
          double s = now_s();
          if (!m.fits_after(id, left - 1)) throw std::runtime_error("bench_grammar: a fixture instance does not fit its own length");
          (pass == 0 ? roomy_us : pass == 1 ? cold_us : warm_us).push_back((now_s() - s) * 1e6);
          if (pass > 0 && i % 4 == 0) {  // what refusing a token would cost here
            s = now_s();
            m.fill_budget_bitmask(mask, left - 1);
            (pass == 1 ? mask_cold_us : mask_warm_us).push_back((now_s() - s) * 1e6);
          }
          if (!m.accept_token(id)) throw std::runtime_error("bench_grammar: a fixture instance was rejected");
        }
      }
    }
    const ClosingGraph::Stats st = g->closing_graph().stats();
    total.nodes += st.nodes;
    total.expansions += st.expansions;
    total.expand_seconds += st.expand_seconds;
    total.expand_steps += st.expand_steps;
    total.searches += st.searches;
    total.gave_up += st.gave_up;
    total.bytes = std::max(total.bytes, st.bytes);
    total.resets += st.resets;
    if (per_schema)
      std::printf("  %-20s nodes %lld walks %lld (%.0f ms) searches %lld gave up %lld resets %lld bytes %.1f MiB\n",
                  c["name"].get<std::string>().c_str(), (long long)st.nodes, (long long)st.expansions, st.expand_seconds * 1e3,
                  (long long)st.searches, (long long)st.gave_up, (long long)st.resets, st.bytes / 1048576.0);
  }
  print_times("closing      roomy budget, check per token:", roomy_us);
  print_times("closing      tight budget, check per token, cold:", cold_us);
  print_times("closing      tight budget, check per token, warm:", warm_us);
  print_times("closing      budget mask (a refused token), cold:", mask_cold_us);
  print_times("closing      budget mask (a refused token), warm:", mask_warm_us);
  std::printf("closing      vocabulary walks: %.1f ns per trie node stepped\n",
              total.expand_seconds * 1e9 / static_cast<double>(std::max<int64_t>(1, total.expand_steps)));
  std::printf("closing      graphs: %lld nodes, %lld vocabulary walks in %.0f ms (%.2f ms each), %lld searches, %lld gave up, "
              "largest graph %.1f MiB, %lld dropped\n",
              static_cast<long long>(total.nodes), static_cast<long long>(total.expansions), total.expand_seconds * 1e3,
              total.expand_seconds * 1e3 / static_cast<double>(std::max<int64_t>(1, total.expansions)),
              static_cast<long long>(total.searches), static_cast<long long>(total.gave_up), static_cast<double>(total.bytes) / (1 << 20), static_cast<long long>(total.resets));
  std::printf("closing      fewest tokens / fewest bytes of a whole document, 50 schemas: median %.2f, min %.2f, max %.2f\n",
              percentile(ratio, 0.5), percentile(ratio, 0.0), percentile(ratio, 1.0));
}

// Compile times of objects with n optional properties: the one shape whose compile grows
// quadratically (each position must know which keys may still come).
void bench_wide_objects() {
  for (int n : {20, 100, 256}) {
    Json schema = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array({"field_0"})},
                   {"additionalProperties", false}};
    for (int i = 0; i < n; ++i) schema["properties"]["field_" + std::to_string(i)] = {{"type", "integer"}};
    const double t0 = now_s();
    const Grammar g = json_schema_grammar(schema);
    std::printf("wide object  %d optional properties: compile %.1f ms (%lld DFA states)\n", n, (now_s() - t0) * 1e3,
                static_cast<long long>(g.total_states()));
  }
}

struct EngineRun {
  double step_s = 0;        // mean time of a decode step
  double steps = 0;
  double mask_us = 0;       // mean mask time per sequence-step (compute + apply), as the engine measured
  double budget_us = 0;     // mean time of the max_tokens checks per sequence-step
  double mean_batch = 0;    // sequences per decode step
};

// Decodes `prompts` together (greedy); every sequence constrained by its grammar when given.
EngineRun run_engine(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                     const std::vector<GrammarPtrLike>& grammars, int max_tokens, const std::string& tag) {
  const double mask_s0 = engine.grammar_mask_seconds();
  const double budget_s0 = engine.grammar_budget_seconds();
  const int64_t masks0 = engine.grammar_mask_count();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.request_id = tag + std::to_string(i);
    r.prompt_tokens = prompts[i];
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    if (!grammars.empty()) r.grammar = grammars[i % grammars.size()];
    engine.add_request(std::move(r), [](RequestOutput&&) {});
  }
  engine.step();  // prefill
  EngineRun run;
  double batch = 0;
  while (engine.has_work()) {
    const int running = engine.stats().num_running;
    const double t0 = now_s();
    engine.step();
    run.step_s += now_s() - t0;
    run.steps += 1;
    batch += running;
  }
  run.step_s /= std::max(1.0, run.steps);
  run.mean_batch = batch / std::max(1.0, run.steps);
  const int64_t masks = engine.grammar_mask_count() - masks0;
  run.mask_us = masks > 0 ? (engine.grammar_mask_seconds() - mask_s0) * 1e6 / static_cast<double>(masks) : 0;
  run.budget_us = masks > 0 ? (engine.grammar_budget_seconds() - budget_s0) * 1e6 / static_cast<double>(masks) : 0;
  return run;
}

void bench_engine(const Json& cases, int threads) {
  EngineOptions options;
  options.kv_cache_memory = 512ull << 20;
  options.max_model_len = 2048;
  options.max_num_seqs = 16;
  options.threads = threads;
  Engine engine(load_model(bench::default_model_path()), options);
  const auto vocab = TokenVocabulary::from_tokenizer(engine.tokenizer(), engine.model_config().vocab_size, engine.stop_token_ids());
  std::vector<GrammarPtrLike> grammars;
  std::vector<std::vector<int32_t>> prompts;
  for (const Json& c : cases) {
    grammars.push_back(std::make_shared<const CompiledGrammar>(json_schema_grammar(c["schema"]), vocab));
    prompts.push_back(engine.tokenizer().encode("<|im_start|>user\nGive an example of a " + c["name"].get<std::string>() +
                                                    " as JSON.<|im_end|>\n<|im_start|>assistant\n",
                                                false));
  }
  std::printf("engine       SmolLM2-135M on the CPU, %d threads, greedy, 64 new tokens per sequence\n", threads);
  for (const int batch : {1, 16}) {
    const std::vector<std::vector<int32_t>> p(prompts.begin(), prompts.begin() + batch);
    const EngineRun free_run = run_engine(engine, p, {}, 64, "free");
    std::vector<GrammarPtrLike> g(grammars.begin() + (batch == 1 ? 0 : 16), grammars.begin() + (batch == 1 ? 1 : 32));
    const EngineRun cold = run_engine(engine, p, g, 64, "cold");
    const EngineRun warm = run_engine(engine, p, g, 64, "warm");
    std::printf("batch %-2d     free step %.2f ms | constrained step %.2f ms (batch %.1f) | mask per sequence-step: warm %.1f us "
                "= %.2f%% of the free step at this batch, cold %.1f us | budget checks: warm %.1f us, cold %.1f us\n",
                batch, free_run.step_s * 1e3, warm.step_s * 1e3, warm.mean_batch, warm.mask_us,
                100.0 * warm.mask_us * 1e-6 * warm.mean_batch / free_run.step_s, cold.mask_us, warm.budget_us, cold.budget_us);
    // max_tokens 16: below most documents' natural length, so most close early (searches in tokens).
    std::vector<GrammarPtrLike> fresh;
    for (const GrammarPtrLike& x : g) fresh.push_back(std::make_shared<const CompiledGrammar>(Grammar(x->grammar()), vocab));
    const EngineRun tight_cold = run_engine(engine, p, fresh, 16, "tightcold");
    const EngineRun tight = run_engine(engine, p, fresh, 16, "tight");
    std::printf("batch %-2d     max_tokens 16: budget checks per sequence-step warm %.1f us = %.2f%% of the free step, cold %.1f us "
                "= %.2f%%\n",
                batch, tight.budget_us, 100.0 * tight.budget_us * 1e-6 * tight.mean_batch / free_run.step_s, tight_cold.budget_us,
                100.0 * tight_cold.budget_us * 1e-6 * tight_cold.mean_batch / free_run.step_s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "smollm2";
  bool engine = false;
  bool per_schema = false;  // the closing graph of each schema: states, walks, searches
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--vocab" && i + 1 < argc) which = argv[++i];
    if (a == "--engine") engine = true;
    if (a == "--per-schema") per_schema = true;
    if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
  }
  const Json cases = fixture_schemas();
  const Loaded l = load_vocab(which);
  bench_masks(l, cases);
  bench_closing(l, cases, per_schema);
  bench_wide_objects();
  if (engine) bench_engine(cases, threads);
  return 0;
}
