#pragma once
// Models with random weights of a real model's shapes, for benchmarks that need a large model
// and no download (the GPU benchmark on a machine with no network): the config of a known
// architecture and bf16 weights drawn from a fixed seed. Projections are uniform with the
// standard deviation 0.02 that HF initialises with, norms are 1, so activations stay finite
// through every layer; the tokens they produce mean nothing, the time and memory they take are
// those of the real model.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/bf16.hpp"
#include "model/formats/model_config.hpp"
#include "model/formats/weights.hpp"

namespace fp8serve::bench {

inline std::vector<std::string> random_model_shapes() { return {"llama3-8b", "qwen3-8b", "smollm2-135m"}; }

// The architecture of a named model (config.json values of the published checkpoints).
inline ModelConfig random_model_config(const std::string& shape) {
  ModelConfig c;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = 32768;
  if (shape == "llama3-8b") {  // meta-llama/Meta-Llama-3-8B
    c.family = Family::llama;
    c.architecture = "LlamaForCausalLM";
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0f;
  } else if (shape == "qwen3-8b") {  // Qwen/Qwen3-8B
    c.family = Family::qwen3;
    c.architecture = "Qwen3ForCausalLM";
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_layers = 36;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 151936;
    c.rope_theta = 1000000.0f;
    c.rms_norm_eps = 1e-6f;
    c.qk_norm = true;
  } else if (shape == "smollm2-135m") {  // HuggingFaceTB/SmolLM2-135M-Instruct
    c.family = Family::llama;
    c.architecture = "LlamaForCausalLM";
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_layers = 30;
    c.num_heads = 9;
    c.num_kv_heads = 3;
    c.head_dim = 64;
    c.vocab_size = 49152;
    c.rope_theta = 100000.0f;
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 8192;
  } else {
    throw std::invalid_argument("unknown model shape '" + shape + "'");
  }
  c.eos_token_ids = {0};
  validate_config(c);
  return c;
}

// Every tensor the config implies (expected_weight_shapes), filled from `seed` on all cores.
inline ModelWeights random_model_weights(const ModelConfig& config, uint64_t seed = 1) {
  ModelWeights weights;
  for (const auto& [name, shape] : expected_weight_shapes(config)) {
    HostTensor& t = weights.tensors[name];
    t.name = name;
    t.shape = shape;
    t.data.resize(static_cast<std::size_t>(t.num_elements()));
  }
  std::vector<HostTensor*> tensors;
  for (auto& [name, t] : weights.tensors) tensors.push_back(&t);
  const unsigned num_threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < num_threads; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < tensors.size(); i += num_threads) {
        HostTensor& t = *tensors[i];
        const bool norm = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
        uint64_t state = seed * 0x9E3779B97F4A7C15ull + i + 1;
        for (uint16_t& value : t.data) {
          if (norm) {
            value = bf16_encode(1.0f);
            continue;
          }
          state ^= state << 13;  // xorshift64
          state ^= state >> 7;
          state ^= state << 17;
          // uniform in [-0.0346, 0.0346): standard deviation 0.02
          const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f) - 0.5f;
          value = bf16_encode(u * 0.0693f);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return weights;
}

}  // namespace fp8serve::bench
