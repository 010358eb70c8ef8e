#include "server/engine/engine_options.hpp"

namespace fp8serve {

EngineOptions engine_options_from_config(const Config& config) {
  EngineOptions options;
  options.device = config.device;
  options.gpu_memory_utilization = config.gpu_memory_utilization;
  options.kv_dtype = config.kv_cache_dtype;
  options.kv_scale_margin = static_cast<float>(config.kv_scale_margin);
  options.quantize_fp8 = config.quantization == Quantization::fp8;
  options.quantize_lm_head = config.fp8_lm_head;
  // A bf16 pool is exact already: the window applies to FP8 KV alone (the start-up log says so).
  options.kv_bf16_window = options.kv_dtype == KvDtype::fp8_e4m3 ? config.kv_bf16_window : 0;
  options.kv_bf16_window_values = config.kv_bf16_window_tensors == KvWindowTensors::kv;
  options.kv_rotation = config.kv_rotation;  // the engine applies it to an FP8 pool only
  options.max_tail_share = config.kv_bf16_window_share;
  options.block_size = config.block_size;
  if (config.kv_cache_memory > 0) options.kv_cache_memory = static_cast<uint64_t>(config.kv_cache_memory);
  options.max_model_len = config.max_model_len;
  options.max_num_seqs = config.max_num_seqs;
  options.max_num_batched_tokens = config.max_num_batched_tokens;
  options.priority_scheduling = config.scheduling_policy == SchedulingPolicy::priority;
  options.enable_prefix_caching = config.enable_prefix_caching;
  options.threads = config.threads;
  options.enforce_eager = config.enforce_eager;
  options.lazy_graph_capture = config.lazy_graph_capture;
  if (config.speculative_method != SpeculativeMethod::none) options.num_speculative_tokens = config.num_speculative_tokens;
  if (config.speculative_method == SpeculativeMethod::draft) options.speculative_model = config.speculative_model;
  options.ngram = NgramOptions{config.prompt_lookup_min, config.prompt_lookup_max};
  options.speculative_disable_by_batch_size = config.speculative_disable_by_batch_size;
  return options;
}

}  // namespace fp8serve
