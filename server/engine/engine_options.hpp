#pragma once
// The engine's configuration: what config/ validated, in the engine's terms (engine.hpp).
#include <cstdint>
#include <string>

#include "kernels/kv_dtype.hpp"
#include "kernels/kv_scale_math.hpp"
#include "kernels/paged_kv.hpp"
#include "config/config.hpp"
#include "server/engine/speculation.hpp"

namespace fp8serve {

struct EngineOptions {
  std::string device = "cpu";  // auto | cpu | cuda (server/engine/device_select.hpp); the CLI's default is auto
  KvDtype kv_dtype = KvDtype::fp8_e4m3;
  float kv_scale_margin = kDefaultKvScaleMargin;
  bool quantize_fp8 = false;           // --quantization fp8 (TransformerOptions)
  bool quantize_lm_head = false;       // with it, the LM head too (--fp8-lm-head)
  int kv_bf16_window = kDefaultKvBf16Window;             // --kv-bf16-window tokens (FP8 pool only; 0 = off)
  bool kv_bf16_window_values = false;  // --kv-bf16-window-tensors kv (true) or k (false)
  KvRotation kv_rotation = kDefaultKvRotation;  // --kv-rotation (FP8 pool only)
  // --kv-bf16-window-share: the most of the KV budget the window's rings may take; as many rings
  // as fit are made, and a sequence runs only with one (they cap how many run at once).
  double max_tail_share = kDefaultKvBf16WindowShare;
  int block_size = kDefaultBlockSize;
  // Bytes of K + V pool, the bf16 window's tail pool included; 0 = derive: on a GPU
  // gpu_memory_utilization of its memory minus what the weights and buffers took, on the CPU
  // kDefaultCpuKvCacheMemory.
  uint64_t kv_cache_memory = 0;
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  int max_model_len = 0;                  // 0 = the model's max_position_embeddings
  int max_num_seqs = kDefaultMaxNumSeqs;
  int max_num_batched_tokens = kDefaultMaxNumBatchedTokens;
  bool priority_scheduling = false;       // --scheduling-policy priority (Scheduler's policy)
  bool enable_prefix_caching = true;
  int threads = 0;                        // CPU threads, 0 = all cores
  bool enforce_eager = false;             // no CUDA graphs (decode steps replay them otherwise)
  bool lazy_graph_capture = false;        // capture decode graphs on first use, not at start-up
  // Speculative decoding (server/engine/speculation.hpp): 0 = off; else ngram proposals of up to this
  // many tokens, verified in one pass.
  int num_speculative_tokens = 0;
  NgramOptions ngram;
  // Non-empty: draft-model proposals from this model (server/engine/draft_model.hpp) instead of ngram.
  std::string speculative_model;
  int speculative_disable_by_batch_size = kDefaultSpeculativeDisableByBatchSize;
};

constexpr uint64_t kDefaultCpuKvCacheMemory = 1ull << 30;

// The engine's part of the configuration (config/ validated it).
EngineOptions engine_options_from_config(const Config& config);

}  // namespace fp8serve
