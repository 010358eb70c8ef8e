// [gpu] Speculative decoding with --device cuda: greedy output with ngram speculation equals plain
// decoding's, token for token and bit for bit in every logprob, on the CUDA backend - in CI on the
// emulated H200 (CTest test_speculative_cuda_emu), on a GPU in test_engine (tests/gpu/run.sh).
// What makes it hold there (docs/speculative-decoding.md): a speculating sequence enters the
// forward pass as one single-token row per verified token, so the decode attention, whose
// partitions depend on a row's own context only, computes each row as that token's decode step
// would; the decode graphs serve those steps in the bucket of their row count; and proposals go
// only into steps of at most 16 tokens without a prefill chunk, where the FP8-weight GEMV is
// batch invariant (Backend::batch_invariant_tokens). Tiny fixtures (the emulator runs every
// kernel thread by thread): bf16 and FP8 pools, the bf16 window, FP8 weights, device sampling
// (greedy picks and seeded candidates), the draft model.
#include "tests/unit/engine/spec_test_util.hpp"

using namespace fp8serve;
using namespace fp8serve::test;

namespace {

EngineOptions cuda_options(KvDtype dtype) {
  EngineOptions options = small_options(dtype);
  options.device = "cuda";
  options.max_num_seqs = 4;
  options.lazy_graph_capture = true;  // the buckets a run uses, not all of them (the emulator is slow)
  return options;
}

// Three prompts that give lookup something to find (the emulator is slow: few prompts, short
// runs): a prompt, the model's own greedy continuation of it (on the CPU, with the pool under
// test), and the prompt again, as input-grounded work repeats its input - after the second copy
// the model tends to continue as it did, which lookup finds in the prompt, and now and then it
// does not (a rejection).
std::vector<std::vector<int32_t>> echo_prompts(const std::string& model, KvDtype dtype = KvDtype::bf16) {
  const std::vector<std::vector<int32_t>> all = spec_prompts();
  const std::vector<std::vector<int32_t>> bases = {all[0], all[3], all[8]};
  EngineOptions options = small_options(dtype);
  auto engine = make_engine(model, options);
  Outputs out;
  for (std::size_t i = 0; i < bases.size(); ++i)
    engine->add_request(greedy_request(std::to_string(i), bases[i], 20), collect(out));
  run_to_completion(*engine);
  std::vector<std::vector<int32_t>> prompts;
  for (std::size_t i = 0; i < bases.size(); ++i) {
    std::vector<int32_t> p = bases[i];
    const std::vector<int32_t>& continuation = out.at(std::to_string(i)).at(0).tokens;
    p.insert(p.end(), continuation.begin(), continuation.end());
    p.insert(p.end(), bases[i].begin(), bases[i].end());
    prompts.push_back(p);
  }
  return prompts;
}

}  // namespace

TEST_CASE("ngram speculation on CUDA: greedy output == plain decoding, bitwise", "[gpu][spec]") {
  if (!have_cuda_device()) return;
  uint64_t n = 0;
  // bf16 weights and pool, requests joining a running batch.
  n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen2"), cuda_options(KvDtype::bf16), 3, 24, true, echo_prompts(fixture("models/tiny-qwen2"))));
  // FP8 pool with the bf16 window (K and V) and prefix caching.
  EngineOptions window = cuda_options(KvDtype::fp8_e4m3);
  window.kv_bf16_window = 32;
  window.kv_bf16_window_values = true;
  window.enable_prefix_caching = true;
  n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen3"), window, 4, 40, true,
                                       echo_prompts(fixture("models/tiny-qwen3"), KvDtype::fp8_e4m3)));
  // FP8 weights (the GEMV) and the FP8 pool. All requests start at once: a step that mixes a
  // prefill chunk with decodes runs the projections on cuBLASLt's FP8 GEMM over quantized
  // activations, so a plain decode token computed in such a step is not what it is alone - the
  // plain run itself is batch variant there, not the speculation.
  EngineOptions fp8 = cuda_options(KvDtype::fp8_e4m3);
  fp8.quantize_fp8 = true;
  n += rejected(check_spec_equals_plain(fixture("models/tiny-qwen2"), fp8, 4, 32, /*stagger=*/false, echo_prompts(fixture("models/tiny-qwen2"))));
  CHECK(n > 0);  // rollbacks happened
}

TEST_CASE("ngram speculation on CUDA: seeded sampling on the device draws plain decoding's tokens", "[gpu][spec]") {
  if (!have_cuda_device()) return;
  // No processor or n > 1, so every step samples on the device: the top-k prefilter's candidates
  // and the host's seeded draw, row after row of each verification.
  const auto prompts = echo_prompts(fixture("models/tiny-qwen2"));
  std::vector<GenerationRequest> requests;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r = greedy_request(std::to_string(i), prompts[i], 24);
    r.sampling.temperature = i % 2 == 0 ? 0.2f : 0.6f;
    r.sampling.top_k = i % 3 == 0 ? 20 : 0;
    r.sampling.seed = 1000 + i;
    requests.push_back(r);
  }
  EngineOptions options = cuda_options(KvDtype::fp8_e4m3);
  const RunResult plain = run_batch(fixture("models/tiny-qwen2"), options, requests);
  options.num_speculative_tokens = 4;
  options.speculative_disable_by_batch_size = 64;
  const RunResult spec = run_batch(fixture("models/tiny-qwen2"), options, requests);
  check_same(plain.outputs, spec.outputs, "sampled on CUDA");
  CHECK(spec.counters.num_accepted_tokens > 0);
}

TEST_CASE("draft-model speculation on CUDA: a model drafting for itself, bitwise", "[gpu][spec][draft]") {
  if (!have_cuda_device()) return;
  EngineOptions options = cuda_options(KvDtype::bf16);
  options.speculative_model = fixture("models/tiny-llama");
  const SpecDecodeCounters c = check_spec_equals_plain(fixture("models/tiny-llama"), options, 3, 24, true, echo_prompts(fixture("models/tiny-llama")));
  CHECK(c.num_accepted_tokens > 0);
}
