// Speculative decoding (ngram) must not change a request's output: greedy tokens and the
// logprob of every chosen token (a function of the whole logits row, so a bitwise witness of
// it) equal plain decoding's, for the bf16 and FP8 pools, with the bf16 window, several K,
// requests joining and leaving, preemption in a tiny pool; a seeded sampled request draws
// the very tokens it draws without speculation (server/engine/speculation.hpp says why), and sampled
// draws follow the model's exact distribution (a chi-square test). The pool's
// invariants hold after every step (rejected proposals rolled back: no block, key or slot left).
#include "spec_test_util.hpp"
#include "server/grammar/json_schema.hpp"

using namespace fp8serve;
using namespace fp8serve::test;


TEST_CASE("ngram speculation: greedy output == plain decoding, bitwise, bf16 and FP8 pools, several K", "[engine][spec]") {
  // Under the sanitizers too, long enough that every configuration has a proposal accepted (12
  // tokens were not, for tiny-qwen3 with the rotated FP8 pool).
  const int max_tokens = kSanitized ? 24 : 40;
  uint64_t n = 0;
  for (const int k : {1, 3, 6}) {
    n += rejected(check_spec_equals_plain(fixture("models/tiny-llama"), small_options(KvDtype::bf16), k, max_tokens));
    n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen3"), small_options(KvDtype::fp8_e4m3), k, max_tokens));
  }
  n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen2"), small_options(KvDtype::fp8_e4m3), 4, max_tokens));
  // Both rotations on tiny-qwen2: unrotated, tiny-qwen3 has its proposals accepted with the bf16
  // dot's arithmetic but not with the fp32 dot's (0 of 6 in 40 tokens; CPUs without AVX512-BF16).
  for (const KvRotation rotation : {KvRotation::none, KvRotation::hadamard}) {  // the default's and the other
    EngineOptions options = small_options(KvDtype::fp8_e4m3);
    options.kv_rotation = rotation;
    n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen2"), options, 3, max_tokens));
  }
  n += rejected(check_spec_equals_plain(fixture("models/tiny-llama"), small_options(KvDtype::fp8_e4m3), 4, max_tokens));
  CHECK(n > 0);  // rollbacks happened
}

TEST_CASE("ngram speculation with the bf16 window: proposals stop at the window's block boundary", "[engine][spec][window]") {
  const int max_tokens = kSanitized ? 48 : 72;  // long enough to cross several window boundaries, and to see a rejection
  for (const bool values : {false, true}) {
    EngineOptions options = small_options(KvDtype::fp8_e4m3);
    options.kv_bf16_window = 32;
    options.kv_bf16_window_values = values;
    options.enable_prefix_caching = true;
    uint64_t n = 0;
    for (const int k : {2, 5}) n += rejected(check_spec_equals_plain(fixture("models/tiny-llama"), options, k, max_tokens));
    CHECK(n > 0);
  }
}

TEST_CASE("ngram speculation with prefix caching: no key is published for a rejected proposal", "[engine][spec]") {
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.enable_prefix_caching = true;
  // 48 tokens also under the sanitizers: a shorter run (12) accepted every proposal there.
  CHECK(rejected(check_spec_equals_plain(fixture("models/tiny-llama"), options, 4, 48)) > 0);
}

TEST_CASE("ngram speculation under preemption in a tiny pool: same output, every block back", "[engine][spec][preemption]") {
  const int max_tokens = kSanitized ? 12 : 32;
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    EngineOptions roomy = small_options(dtype);
    roomy.enable_prefix_caching = true;
    const auto requests = greedy_requests(spec_prompts(), max_tokens);
    const RunResult plain = run_batch(fixture("models/tiny-llama"), roomy, requests);
    EngineOptions tiny = roomy;
    const uint64_t block_bytes = 2ull * 2 * 2 * 16 * 16 * kv_dtype_size(dtype);  // layers, K+V, kv heads, dim, tokens
    tiny.kv_cache_memory = 12 * block_bytes;
    tiny.num_speculative_tokens = 4;
    tiny.speculative_disable_by_batch_size = 64;
    const RunResult spec = run_batch(fixture("models/tiny-llama"), tiny, requests);
    INFO(std::string(kv_dtype_name(dtype)) << " pool");
    CHECK(spec.preemptions > 0);
    CHECK(spec.counters.num_accepted_tokens > 0);
    check_same(plain.outputs, spec.outputs, std::string("preemption, ") + std::string(kv_dtype_name(dtype)));
  }
}

TEST_CASE("ngram speculation: seeded sampling, n > 1 and stop strings give plain decoding's output", "[engine][spec][sampling]") {
  const auto prompts = spec_prompts();
  std::vector<GenerationRequest> requests;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r = greedy_request(std::to_string(i), prompts[i], kSanitized ? 12 : 40);
    r.sampling.temperature = i % 2 == 0 ? 0.2f : 0.6f;  // low enough for the tiny model to repeat itself
    r.sampling.top_k = i % 3 == 0 ? 20 : 0;
    r.sampling.repetition_penalty = i == 3 ? 1.1f : 1.0f;
    r.sampling.seed = 1000 + i;
    r.n = i % 4 == 1 ? 3 : 1;
    requests.push_back(r);
  }
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.enable_prefix_caching = true;
  const RunResult plain = run_batch(fixture("models/tiny-qwen2"), options, requests);
  // Stop strings cut at a token taken from plain decoding's text: with speculation the cut
  // lands inside an accepted run, whose remaining tokens must be dropped.
  for (auto& r : requests) {
    const std::string& text = plain.outputs.at(r.request_id).at(0).text;
    if (text.size() > 12) r.stop = {text.substr(text.size() / 2, 3)};
  }
  const RunResult plain_stop = run_batch(fixture("models/tiny-qwen2"), options, requests);
  options.num_speculative_tokens = 4;
  options.speculative_disable_by_batch_size = 64;
  const RunResult spec_stop = run_batch(fixture("models/tiny-qwen2"), options, requests);
  check_same(plain_stop.outputs, spec_stop.outputs, "sampled, stop strings");
  for (auto& r : requests) r.stop.clear();
  const RunResult spec = run_batch(fixture("models/tiny-qwen2"), options, requests);
  check_same(plain.outputs, spec.outputs, "sampled");
  CHECK(spec.counters.num_accepted_tokens > 0);
}

TEST_CASE("ngram speculation on the default model: a repeated document, bitwise, high acceptance", "[engine][spec][default_model]") {
  auto engine = make_engine(default_model_path(), EngineOptions{});
  const Tokenizer& tokenizer = engine->tokenizer();
  const std::string document =
      "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
      "How vexingly quick daft zebras jump! The five boxing wizards jump quickly. ";
  const std::vector<int32_t> prompt = tokenizer.encode("Repeat this text exactly.\n\n" + document + "\n\nRepeated:\n" + document.substr(0, 20), true);
  engine.reset();
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    EngineOptions options = small_options(dtype);
    options.kv_cache_memory = 64u << 20;
    options.kv_bf16_window = dtype == KvDtype::fp8_e4m3 ? 32 : 0;
    const std::vector<GenerationRequest> requests{greedy_request("doc", prompt, kSanitized ? 16 : 48),
                                                  greedy_request("doc2", prompt, kSanitized ? 16 : 32)};
    const RunResult plain = run_batch(default_model_path(), options, requests);
    options.num_speculative_tokens = 5;
    const RunResult spec = run_batch(default_model_path(), options, requests);
    check_same(plain.outputs, spec.outputs, std::string("default model, ") + std::string(kv_dtype_name(dtype)));
    const double rate = static_cast<double>(spec.counters.num_accepted_tokens) / std::max<uint64_t>(1, spec.counters.num_draft_tokens);
    std::printf("[spec] default model, %s: acceptance %.2f over %llu drafts\n", std::string(kv_dtype_name(dtype)).c_str(), rate,
                static_cast<unsigned long long>(spec.counters.num_drafts));
    CHECK(rate > 0.5);
  }
}

namespace {

// The model's own distribution after `prefix`: the top-2 tokens and their probabilities
// renormalized over the two (what top_k = 2 at temperature 1 samples from), from a greedy run's
// logprobs (the raw model distribution, server/engine/sampling.hpp).
std::vector<std::pair<int32_t, double>> top2(Engine& engine, const std::vector<int32_t>& prefix) {
  GenerationRequest r = greedy_request("top2", prefix, 1);
  r.sampling.num_logprobs = 2;
  std::vector<TokenLogprob> top;
  engine.add_request(r, [&](RequestOutput&& out) {
    if (!out.logprobs.empty()) top = out.logprobs[0].top_logprobs;
  });
  run_to_completion(engine);
  REQUIRE(top.size() == 2);
  const double a = std::exp(static_cast<double>(top[0].logprob)), b = std::exp(static_cast<double>(top[1].logprob));
  return {{top[0].token, a / (a + b)}, {top[1].token, b / (a + b)}};
}

}  // namespace

TEST_CASE("ngram speculation samples the model's distribution: chi-square over 3-token continuations", "[engine][spec][chi2]") {
  // top_k = 2 makes every draw one of 8 continuations whose exact probabilities are products of
  // the model's renormalized top-2 probabilities, computed here from logprobs of plain steps
  // (bf16 KV: a prefill of the longer prefix computes what the decode did, up to rounding; FP8
  // would calibrate other scales). The prompt ends with tiny-qwen2's own greedy loop, so lookup
  // (from one token on) proposes a continuation after most first tokens, accepted or not.
  const std::string model = fixture("models/tiny-qwen2");
  EngineOptions options = small_options(KvDtype::bf16);
  options.ngram = NgramOptions{1, 3};
  auto reference = make_engine(model, options);
  std::vector<int32_t> prompt = spec_prompts()[8];
  {
    Outputs greedy;
    reference->add_request(greedy_request("loop", prompt, 32), collect(greedy));
    run_to_completion(*reference);
    const std::vector<int32_t>& loop = greedy.at("loop").at(0).tokens;
    prompt.insert(prompt.end(), loop.begin(), loop.end());
  }
  std::map<std::vector<int32_t>, double> exact;
  for (const auto& [t1, p1] : top2(*reference, prompt)) {
    std::vector<int32_t> prefix1 = prompt;
    prefix1.push_back(t1);
    for (const auto& [t2, p2] : top2(*reference, prefix1)) {
      std::vector<int32_t> prefix2 = prefix1;
      prefix2.push_back(t2);
      for (const auto& [t3, p3] : top2(*reference, prefix2)) exact[{t1, t2, t3}] = p1 * p2 * p3;
    }
  }
  REQUIRE(exact.size() == 8);

  options.num_speculative_tokens = 3;
  options.speculative_disable_by_batch_size = 64;
  auto engine = make_engine(model, options);
  const int num_draws = kSanitized ? 800 : 4000;
  std::map<std::vector<int32_t>, int> counts;
  Outputs outputs;
  for (int i = 0; i < num_draws; ++i) {
    GenerationRequest r = greedy_request(std::to_string(i), prompt, 3);
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 2;
    r.sampling.seed = 77 + static_cast<uint64_t>(i);
    engine->add_request(r, collect(outputs));
    if (i % 16 == 15) run_to_completion(*engine);
  }
  run_to_completion(*engine);
  for (const auto& [id, choices] : outputs) ++counts[choices.at(0).tokens];
  REQUIRE(counts.size() <= 8);
  // Pearson's statistic over the 8 cells (7 degrees of freedom); at significance 0.001 the
  // critical value is 24.32, so a correct sampler fails one run in a thousand.
  double chi2 = 0;
  for (const auto& [tokens, p] : exact) {
    const double expected = p * num_draws;
    const double observed = counts.count(tokens) ? counts.at(tokens) : 0;
    chi2 += (observed - expected) * (observed - expected) / expected;
    std::printf("[chi2] %d %d %d: exact %.4f, observed %.4f\n", tokens[0], tokens[1], tokens[2], p, observed / num_draws);
  }
  const SpecDecodeCounters& c = engine->spec_decode();
  std::printf("[chi2] statistic %.2f (critical 24.32 at 0.001, 7 dof); %llu drafts, %llu of %llu tokens accepted\n", chi2,
              static_cast<unsigned long long>(c.num_drafts), static_cast<unsigned long long>(c.num_accepted_tokens),
              static_cast<unsigned long long>(c.num_draft_tokens));
  // Speculation really ran, and both acceptance and rejection happened often.
  CHECK(c.num_accepted_tokens > static_cast<uint64_t>(num_draws / 10));
  CHECK(c.num_draft_tokens - c.num_accepted_tokens > static_cast<uint64_t>(num_draws / 10));
  CHECK(chi2 < 24.32);
}

TEST_CASE("ngram speculation with structured outputs: the grammar masks every verified row", "[engine][spec][structured]") {
  // A JSON answer that copies fields from the prompt: lookup proposes them, the mask applies to
  // each row as to a decode step (a proposal the grammar forbids cannot be the sampled token).
  const char* schema = R"({"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
      "year": {"type": "integer"}}, "required": ["name", "city", "year"], "additionalProperties": false})";
  EngineOptions options = small_options(KvDtype::fp8_e4m3);
  options.kv_cache_memory = 64u << 20;
  auto probe = make_engine(default_model_path(), options);
  const auto vocab = grammar::TokenVocabulary::from_tokenizer(probe->tokenizer(), probe->model_config().vocab_size,
                                                              probe->stop_token_ids());
  const auto compiled = std::make_shared<const grammar::CompiledGrammar>(
      grammar::json_schema_grammar(nlohmann::ordered_json::parse(schema)), vocab);
  const std::vector<int32_t> prompt = probe->tokenizer().encode(
      "Record: {\"name\": \"Grace Hopper\", \"city\": \"Arlington\", \"year\": 1906}\nThe same record as JSON:\n", true);
  probe.reset();
  std::vector<GenerationRequest> requests;
  for (const bool greedy : {true, false}) {
    GenerationRequest r = greedy_request(greedy ? "greedy" : "sampled", prompt, 48);
    r.ignore_eos = false;
    r.grammar = compiled;
    if (!greedy) {
      r.sampling.temperature = 0.7f;
      r.sampling.seed = 5;
    }
    requests.push_back(r);
  }
  const RunResult plain = run_batch(default_model_path(), options, requests);
  options.num_speculative_tokens = 4;
  const RunResult spec = run_batch(default_model_path(), options, requests);
  check_same(plain.outputs, spec.outputs, "structured output");
  for (const auto& [id, choices] : spec.outputs) {
    INFO(choices.at(0).text);
    CHECK(choices.at(0).finish == FinishReason::stop);
    CHECK(nlohmann::json::parse(choices.at(0).text).at("city") == "Arlington");
  }
  CHECK(spec.counters.num_accepted_tokens > 0);
}
