#include "server/inspect.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "model/loader.hpp"

namespace fp8serve {

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace

int run_inspect(const Config& config) {
  const auto start = std::chrono::steady_clock::now();
  const LoadedModel model = load_model(config.model);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ModelConfig& c = model.config;

  std::string types;
  for (const auto& [type, count] : model.tensor_types)
    types += (types.empty() ? "" : ", ") + type + " x" + std::to_string(count);
  std::string eos;
  for (int id : c.eos_token_ids) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
  char theta[32];
  std::snprintf(theta, sizeof theta, "%g", static_cast<double>(c.rope_theta));
  std::string rope = std::string("theta ") + theta;
  if (c.rope_scaling.kind == RopeScaling::Kind::llama3)
    rope += ", llama3 scaling (factor " + std::to_string(static_cast<int>(c.rope_scaling.factor)) + ")";

  std::printf("model            %s\n", model.name.c_str());
  std::printf("path             %s (%s, loaded in %.2f s)\n", model.path.c_str(), model.format.c_str(), seconds);
  std::printf("architecture     %s (family %s)\n", c.architecture.c_str(), std::string(family_name(c.family)).c_str());
  std::printf("layers           %d\n", c.num_layers);
  std::printf("hidden size      %d (intermediate %d)\n", c.hidden_size, c.intermediate_size);
  std::printf("heads            %d query, %d kv (GQA %d:1), head dim %d\n", c.num_heads, c.num_kv_heads,
              c.num_kv_heads > 0 ? c.num_heads / c.num_kv_heads : 0, c.head_dim);
  std::printf("vocabulary       %d\n", c.vocab_size);
  std::printf("context length   %d\n", c.max_position_embeddings);
  std::printf("rope             %s\n", rope.c_str());
  std::printf("rms norm eps     %g\n", static_cast<double>(c.rms_norm_eps));
  std::printf("qkv bias         %s, q/k norm %s, tied embeddings %s\n", c.attention_bias ? "yes" : "no",
              c.qk_norm ? "yes" : "no", c.tie_word_embeddings ? "yes" : "no");
  std::printf("parameters       %.1f M\n", static_cast<double>(num_parameters(c)) / 1e6);
  std::printf("weight bytes     %s as bf16\n", human_bytes(static_cast<double>(model.weights.num_bytes())).c_str());
  std::printf("stored tensors   %s\n", types.c_str());
  std::printf("tokenizer        %s, %d tokens, bos %d, eos %s\n", model.tokenizer->kind().c_str(),
              model.tokenizer->vocab_size(), c.bos_token_id, eos.c_str());
  std::printf("chat template    %s\n",
              model.chat_template.empty() ? "none" : ("yes (" + std::to_string(model.chat_template.size()) + " bytes)").c_str());
  return 0;
}

}  // namespace fp8serve
