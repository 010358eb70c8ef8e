#pragma once
// fp8serve's configuration: every flag of every command, parsed and validated here, once.
// Sources, later ones winning: defaults, then --config FILE (JSON, long flag names as keys),
// then the environment (FP8SERVE_<FLAG>), then the command line. Nothing below config/ reads
// argv or the environment.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/kv_events_config.hpp"
#include "kernels/kv_dtype.hpp"
#include "kernels/kv_scale_math.hpp"
#include "kernels/paged_kv.hpp"

namespace fp8serve {

// A bad flag or value: the message names the flag and what it accepts.
// --kv-bf16-window-share's default: rings for every sequence at the default budget, most bytes to
// the FP8 pool below it (why and figures: docs/fp8-kv-cache.md, "Why 1/8").
inline constexpr double kDefaultKvBf16WindowShare = 0.125;

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Flag defaults the engine's option structs share (server/engine.hpp, server/draft_model.hpp):
// written once, here. The block size and the scale margin are the kernels' (kDefaultBlockSize,
// kDefaultKvScaleMargin), which the cache and the model use too.
// 96 tokens, K only: the shortest window that keeps the long-context KL under 6e-4 with
// rotation on both pinned texts (docs/fp8-kv-cache.md, "The defaults: a 96-token K window").
inline constexpr int kDefaultKvBf16Window = 96;
inline constexpr KvRotation kDefaultKvRotation = KvRotation::hadamard;
inline constexpr double kDefaultGpuMemoryUtilization = 0.9;
inline constexpr int kDefaultMaxNumSeqs = 64;
inline constexpr int kDefaultMaxNumBatchedTokens = 2048;
inline constexpr int kDefaultSpeculativeDisableByBatchSize = 2;

enum class Command { inspect, generate, serve };

// The choice flags read below config/, parsed here once (their spellings are the flags' values).
enum class Quantization : uint8_t { none, fp8 };                // --quantization
enum class KvWindowTensors : uint8_t { k, kv };                 // --kv-bf16-window-tensors
enum class SpeculativeMethod : uint8_t { none, ngram, draft };  // --speculative-method
enum class SchedulingPolicy : uint8_t { fcfs, priority };        // --scheduling-policy

struct Config {
  Command command = Command::inspect;
  std::string model;  // a Hugging Face model folder or a .gguf file

  // Device and KV cache (docs/design.md, "The FP8 KV contract", "Configuration"). Flag names follow vLLM's.
  std::string device = "auto";            // auto | cpu | cuda
  KvDtype kv_cache_dtype = KvDtype::fp8_e4m3;
  Quantization quantization = Quantization::none;  // projection weights (FP8 checkpoints: always FP8)
  bool fp8_lm_head = false;               // with --quantization fp8, the LM head too
  double kv_scale_margin = kDefaultKvScaleMargin;  // calibrated scale = amax * margin / 448 (docs/fp8-kv-cache.md)
  int kv_bf16_window = kDefaultKvBf16Window;  // newest tokens kept exact in bf16 (multiple of block_size; docs/fp8-kv-cache.md)
  KvWindowTensors kv_bf16_window_tensors = KvWindowTensors::k;  // what the window keeps exact
  double kv_bf16_window_share = kDefaultKvBf16WindowShare;  // the most of the KV budget its rings take
  KvRotation kv_rotation = kDefaultKvRotation;  // FP8 KV: heads rotated before quantizing (docs/fp8-kv-cache.md)
  int block_size = kDefaultBlockSize;
  int64_t kv_cache_memory = 0;            // bytes; 0 = derive (CPU: 1 GiB; CUDA: utilization)
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  int max_model_len = 0;                  // 0 = the model's max_position_embeddings
  int max_num_seqs = kDefaultMaxNumSeqs;
  int max_num_batched_tokens = kDefaultMaxNumBatchedTokens;
  SchedulingPolicy scheduling_policy = SchedulingPolicy::fcfs;
  bool enable_prefix_caching = true;
  int threads = 0;                        // 0 = all cores
  bool enforce_eager = false;             // CUDA: every step op by op, no CUDA graphs
  bool lazy_graph_capture = false;        // CUDA: capture a decode graph on first use, not at start-up

  // Speculative decoding (docs/speculative-decoding.md; vLLM's names).
  SpeculativeMethod speculative_method = SpeculativeMethod::none;  // draft: --speculative-model
  int num_speculative_tokens = 6;            // K: tokens proposed and verified per step
  int prompt_lookup_min = 2;                 // ngram: shortest suffix looked up in prompt + output
  int prompt_lookup_max = 4;                 // ngram: longest
  std::string speculative_model;             // draft: the draft model's path
  // No speculation in a step with more decoding sequences than this: the step is compute-bound.
  int speculative_disable_by_batch_size = kDefaultSpeculativeDisableByBatchSize;

  // Server.
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string served_model_name;          // empty = derived from the model path
  std::string api_key;
  std::string api_key_file;               // the key's file (a mounted secret); read at parse time
  int max_waiting_requests = 256;
  int responses_store_max_entries = 1000;  // /v1/responses kept for GET and previous_response_id
  int64_t responses_store_max_bytes = 64 << 20;
  double responses_store_ttl = 86400.0;    // seconds
  double shutdown_timeout = 30.0;
  std::string chat_template_file;
  std::string tool_call_parser = "auto";  // auto | hermes | llama3_json (vLLM's names)
  bool metrics_public = false;
  // Request fields a router adds (e.g. no_stop_trim): accepted and ignored rather than a 400.
  // Comma-separated on the command line; checked against the field table at start-up.
  std::vector<std::string> ignore_request_fields;
  KvEventsConfig kv_events;                // --kv-events-config
  int64_t max_body_bytes = 4 << 20;       // larger request bodies get 413
  int max_header_bytes = 16 << 10;        // larger request headers get 431
  double request_timeout = 30.0;          // seconds to receive one whole request, or idle (slowloris)
  std::string log_level = "info";

  // generate: the prompt and sampling.
  std::string prompt;
  int max_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  int top_k = 0;
  double min_p = 0.0;
  std::optional<uint64_t> seed;

  std::vector<std::string> environment_variables;  // the FP8SERVE_* names that set a flag, for the log
};

// Flags set through the environment, as containers are configured: FP8SERVE_<FLAG>, the long
// flag name in upper case with '_' for '-' (FP8SERVE_HOST, FP8SERVE_API_KEY,
// FP8SERVE_KV_CACHE_DTYPE). Name -> value; an empty value counts as unset.
using Environment = std::map<std::string, std::string>;

// The FP8SERVE_* variables of this process that name a flag: the one read of the environment.
Environment flag_environment();

// Parses `fp8serve COMMAND MODEL [flags]` with `env` (see Environment). Throws ConfigError.
Config parse_command_line(const std::vector<std::string>& args, const Environment& env = {});

// The usage text, with every flag, its default and its range; for one command, its flags only.
std::string usage(std::optional<Command> command = std::nullopt);
// The usage text the arguments ask for, if they do: `--help`/`-h` first (every command), or
// after a command (`fp8serve serve --help`, anywhere on the line: that command's), or
// `fp8serve help [COMMAND]`. nullopt: no help asked for.
std::optional<std::string> help_requested(const std::vector<std::string>& args);

}  // namespace fp8serve
