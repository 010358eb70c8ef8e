#pragma once
// Helpers of the speculative-decoding tests (test_speculative.cpp: ngram; test_speculative_draft.cpp:
// a draft model): a batch of requests run with and without speculation, compared bit for bit.
#include "engine_test_access.hpp"
#include "engine_test_util.hpp"

namespace fp8serve::test {

// eight_prompts() plus prompts that repeat themselves, so prompt lookup has something to find
// in the prompt as well as in the (often looping) output of the random tiny models.
inline std::vector<std::vector<int32_t>> spec_prompts() {
  std::vector<std::vector<int32_t>> prompts = eight_prompts();
  const std::vector<int32_t> base = prompts[4];
  for (const int period : {5, 13}) {
    std::vector<int32_t> p;
    for (int i = 0; i < 60; ++i) p.push_back(base[static_cast<std::size_t>(i % period)]);
    prompts.push_back(p);
  }
  return prompts;
}

struct RunResult {
  Outputs outputs;
  SpecDecodeCounters counters;
  uint64_t preemptions = 0;
};

// Half the requests start, run two steps, then the rest join (stagger; else all start at once);
// every step checks the pool.
inline RunResult run_batch(const std::string& model, const EngineOptions& options, const std::vector<GenerationRequest>& requests,
                           bool stagger = true) {
  auto engine = make_engine(model, options);
  RunResult result;
  const std::size_t half = stagger ? requests.size() / 2 : requests.size();
  for (std::size_t i = 0; i < half; ++i) engine->add_request(requests[i], collect(result.outputs));
  engine->step();
  engine->step();
  for (std::size_t i = half; i < requests.size(); ++i) engine->add_request(requests[i], collect(result.outputs));
  for (int step = 0; step < 100000 && engine->has_work(); ++step) {
    engine->step();
    EngineTestAccess::check_integrity(*engine);
    if (engine->draft() != nullptr) engine->draft()->block_manager().check_integrity();
  }
  REQUIRE_FALSE(engine->has_work());
  CHECK(engine->block_manager().num_free_blocks() == engine->block_manager().num_blocks());
  if (const DraftModel* draft = engine->draft()) {  // the draft's blocks are all back too
    CHECK(draft->block_manager().num_seqs() == 0);
    CHECK(draft->block_manager().num_free_blocks() == draft->block_manager().num_blocks());
  }
  result.counters = engine->spec_decode();
  result.preemptions = engine->stats().num_preemptions;
  return result;
}

inline std::vector<GenerationRequest> greedy_requests(const std::vector<std::vector<int32_t>>& prompts, int max_tokens) {
  std::vector<GenerationRequest> requests;
  for (std::size_t i = 0; i < prompts.size(); ++i) requests.push_back(greedy_request(std::to_string(i), prompts[i], max_tokens));
  return requests;
}

inline void check_same(const Outputs& plain, const Outputs& spec, const std::string& what) {
  REQUIRE(plain.size() == spec.size());
  for (const auto& [id, choices] : plain) {
    for (const auto& [index, choice] : choices) {
      const Choice& got = spec.at(id).at(index);
      INFO(what << ": request " << id << " choice " << index);
      CHECK(got.finish == choice.finish);
      CHECK(got.tokens == choice.tokens);
      CHECK(got.logprobs == choice.logprobs);  // bitwise
      CHECK(got.text == choice.text);
    }
  }
}

// Returns speculation's counters. That some proposals were rejected is for the caller to check,
// over a test case's runs: a short run (the sanitizers') or a draft model drafting for itself may
// have every one accepted.
inline SpecDecodeCounters check_spec_equals_plain(const std::string& model, EngineOptions options, int k, int max_tokens,
                                                  bool stagger = true,
                                                  const std::vector<std::vector<int32_t>>& prompts = spec_prompts()) {
  const auto requests = greedy_requests(prompts, max_tokens);
  options.num_speculative_tokens = 0;
  const RunResult plain = run_batch(model, options, requests, stagger);
  options.num_speculative_tokens = k;
  options.speculative_disable_by_batch_size = 64;  // speculate at every batch size here
  const RunResult spec = run_batch(model, options, requests, stagger);
  const std::string what = model + (options.speculative_model.empty() ? "" : " drafted by " + options.speculative_model) + ", " + std::string(kv_dtype_name(options.kv_dtype)) + " pool, window " +
                           std::to_string(options.kv_bf16_window) + ", K " + std::to_string(k) + " on " + options.device +
                           (options.quantize_fp8 ? ", FP8 weights" : "");
  check_same(plain.outputs, spec.outputs, what);
  INFO(what);
  std::printf("[spec] %s: %llu drafts, %llu of %llu proposed tokens accepted\n", what.c_str(),
              static_cast<unsigned long long>(spec.counters.num_drafts),
              static_cast<unsigned long long>(spec.counters.num_accepted_tokens),
              static_cast<unsigned long long>(spec.counters.num_draft_tokens));
  // The test means something only if proposals were made and accepted.
  CHECK(spec.counters.num_drafts > 0);
  CHECK(spec.counters.num_accepted_tokens > 0);
  return spec.counters;
}

inline uint64_t rejected(const SpecDecodeCounters& c) { return c.num_draft_tokens - c.num_accepted_tokens; }


}  // namespace fp8serve::test
