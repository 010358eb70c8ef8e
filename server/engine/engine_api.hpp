#pragma once
// The contract between the HTTP front end and the engine (docs/design.md, "One request"): the front end submits
// GenerationRequests and receives RequestOutputs; the engine thread owns the model, the cache
// and the scheduler, and the two sides meet only through thread-safe queues (AsyncEngine).
// The offline `generate` command drives the same Engine directly, batch of one.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/engine/sampling.hpp"
#include "server/grammar/compiled_grammar.hpp"

namespace fp8serve {

enum class FinishReason { stop, length, abort, error };

struct GenerationRequest {
  std::string request_id;               // unique per request
  std::vector<int32_t> prompt_tokens;   // already tokenized (chat template applied)
  SamplingParams sampling;
  int max_tokens = 16;                  // completion tokens; 0: the prompt is only scored (prefill, no token)
  // (vLLM's min_tokens is sampling.min_tokens: until that many tokens are generated, EOS and
  // stop_token_ids are masked out of sampling and stop strings are not looked for.)
  // Prompt logprobs (completions' echo with logprobs, vLLM's prompt_logprobs): -1 none; N >= 0:
  // the logprob of every prompt token after the first, and the N most likely tokens at each of
  // those positions. Computed in prefill from the same forward pass that fills the KV cache;
  // such a request maps no prefix-cache blocks (vLLM does the same), so every position is run.
  int num_prompt_logprobs = -1;
  std::vector<std::string> stop;        // stop strings, matched on text, not emitted unless
  bool include_stop_str_in_output = false;  // ... this is set
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
  int n = 1;                            // parallel samples; they share the prompt's blocks
  int priority = 0;                     // lower runs first, with EngineOptions::priority_scheduling
  bool skip_special_tokens = true;      // in the returned text
  // Structured output: every token is sampled from those the grammar allows (the rest of the
  // logits masked to -inf before penalties, temperature, top-k/p and min-p), and the sequence
  // ends once the grammar is complete. Null: unconstrained.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // When the request reached the server (the front end sets it; unset = when add_request ran).
  std::chrono::steady_clock::time_point arrival{};
};

// One step's news for one choice of one request. Text deltas are valid UTF-8 and never contain
// a stop string or the start of one; the concatenation of all deltas is the choice's text.
struct RequestOutput {
  std::string request_id;
  int index = 0;                        // choice index, 0 .. n-1
  std::vector<int32_t> new_tokens;
  std::string text_delta;
  std::vector<SampleResult> logprobs;   // one per new token, when requested
  // With num_prompt_logprobs >= 0, on each choice's first output: prompt tokens 1 .. n-1 (the
  // first token has no logprob), each with its top num_prompt_logprobs.
  std::vector<SampleResult> prompt_logprobs;
  std::optional<FinishReason> finish;   // set on the last output of this choice
  std::string error;                    // when finish == error: what went wrong
  int prompt_tokens = 0;
  int completion_tokens = 0;            // so far
  int cached_tokens = 0;                // prompt tokens served from the prefix cache
  double queue_s = -1;                  // arrival -> start of the request's first step (< 0: not run)
};

// Where the engine thread posts outputs for one request; called on the engine thread, so it
// must only enqueue (e.g. into an HTTP session's channel) and return.
using OutputSink = std::function<void(RequestOutput&&)>;

// A snapshot of the engine's gauges and counters for /metrics.
struct EngineStats {
  // The KV cache's shape, fixed at start-up: fp8serve:cache_config_info, whose block_size and
  // num_gpu_blocks labels are what routers read from vLLM's vllm:cache_config_info.
  struct CacheConfig {
    int block_size = 0;
    int num_blocks = 0;            // of the KV pool (vLLM's num_gpu_blocks, whatever the device)
    std::string cache_dtype;       // --kv-cache-dtype
    bool prefix_caching = false;   // --enable-prefix-caching
    int bf16_window = 0;           // --kv-bf16-window in effect (0: off)
    std::string rotation;          // --kv-rotation in effect ("none" with a bf16 pool)
  };
  CacheConfig cache;
  int num_running = 0;
  int num_waiting = 0;
  double kv_usage = 0.0;            // fraction of KV blocks in use, [0, 1]
  double kv_tail_usage = 0.0;       // bf16 window: fraction of tail rings owned by sequences, [0, 1]
  uint64_t kv_tail_tokens = 0;      // bf16 window: tokens its rings hold now
  uint64_t kv_ring_waits = 0;       // bf16 window: steps whose next admission waited for a ring (Scheduler)
  uint64_t num_preemptions = 0;
  struct PriorityClass {
    int priority = 0;
    int num_waiting = 0;
    int num_running = 0;
    uint64_t num_preemptions = 0;
  };
  std::vector<PriorityClass> by_priority;  // --scheduling-policy priority: per priority seen (else empty)
  bool speculative = false;         // speculative decoding on: the spec_decode counters below
  uint64_t spec_num_drafts = 0;     // steps that verified proposals, summed over sequences
  uint64_t spec_num_draft_tokens = 0;
  uint64_t spec_num_accepted_tokens = 0;
  std::vector<uint64_t> spec_accepted_per_pos;  // accepted tokens by position in the draft
  double spec_draft_kv_usage = -1;  // --speculative-method draft: the draft's KV pool in use; -1 without
  uint64_t prefix_queries = 0;      // prompt tokens looked up in the prefix cache
  uint64_t prefix_hits = 0;         // of those, found
  std::vector<uint64_t> saturated_per_layer;  // FP8 elements clipped to +-448, per layer
  std::vector<float> k_scales;      // calibrated scales of the running sequences, all layers
  std::vector<float> v_scales;
  struct KvEvents {  // --kv-events-config (server/kv_events.hpp): filled by the server, not the engine
    bool enabled = false;
    uint64_t published = 0;  // events sent (or recorded, with publisher "null")
    uint64_t dropped = 0;    // events dropped because the publisher's queue was full
  };
  KvEvents kv_events;
};

}  // namespace fp8serve
