#include "server/generate.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "model/loader.hpp"
#include "server/engine/engine.hpp"

namespace fp8serve {

int run_generate(const Config& config) {
  using Clock = std::chrono::steady_clock;
  EngineOptions options = engine_options_from_config(config);
  // One sequence: the per-sequence reservations (the bf16 window's rings, the sampled rows'
  // buffers) for one, not for --max-num-seqs.
  options.max_num_seqs = 1;
  LoadedModel model = load_model(config.model);
  const std::vector<int32_t> prompt = model.tokenizer->encode(config.prompt, /*add_special_tokens=*/true);
  Engine engine(std::move(model), options);

  GenerationRequest request;
  request.request_id = "generate";
  request.prompt_tokens = prompt;
  request.max_tokens = config.max_tokens;
  request.sampling.temperature = static_cast<float>(config.temperature);
  request.sampling.top_p = static_cast<float>(config.top_p);
  request.sampling.top_k = config.top_k;
  request.sampling.min_p = static_cast<float>(config.min_p);
  request.sampling.seed = config.seed;

  // The first output arrives with the token sampled after the prefill: that ends the prefill
  // time; the remaining tokens are decode.
  const Clock::time_point start = Clock::now();
  Clock::time_point first_token{};
  int num_generated = 0;
  std::string error;
  FinishReason finish = FinishReason::length;
  engine.add_request(request, [&](RequestOutput&& out) {
    if (num_generated == 0 && !out.new_tokens.empty()) first_token = Clock::now();
    num_generated += static_cast<int>(out.new_tokens.size());
    std::fwrite(out.text_delta.data(), 1, out.text_delta.size(), stdout);
    std::fflush(stdout);
    if (out.finish) {
      finish = *out.finish;
      error = out.error;
    }
  });
  while (engine.has_work()) engine.step();
  const Clock::time_point end = Clock::now();
  // stdout holds exactly the generated text, for pipes and scripts; a terminal gets a newline.
  if (isatty(fileno(stdout))) std::fputc('\n', stdout);
  std::fflush(stdout);
  if (finish == FinishReason::error) {
    std::fprintf(stderr, "fp8serve: %s\n", error.c_str());
    return 1;
  }

  const double prefill_s = std::chrono::duration<double>(first_token - start).count();
  const double decode_s = std::chrono::duration<double>(end - first_token).count();
  const int num_decoded = num_generated - 1;  // the first token came out of the prefill
  std::fprintf(stderr,
               "prompt tokens %zu, generated tokens %d, prefill %.1f tok/s (%.3f s), decode %.1f tok/s "
               "(%.3f s), KV cache %llu bytes (%s) + bf16 window tail %llu bytes, finish %s\n",
               prompt.size(), num_generated, prefill_s > 0 ? prompt.size() / prefill_s : 0.0, prefill_s,
               num_decoded > 0 && decode_s > 0 ? num_decoded / decode_s : 0.0, decode_s,
               static_cast<unsigned long long>(engine.kv_cache_bytes()),
               std::string(kv_dtype_name(options.kv_dtype)).c_str(),
               static_cast<unsigned long long>(engine.kv_tail_bytes()),
               finish == FinishReason::stop ? "stop" : finish == FinishReason::length ? "length" : "abort");
  return 0;
}

}  // namespace fp8serve
