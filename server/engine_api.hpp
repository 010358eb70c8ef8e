#pragma once
// The contract between the HTTP front end and the engine (DESIGN.md §2): the front end submits
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

#include "server/sampling.hpp"

namespace fp8serve {

enum class FinishReason { stop, length, abort, error };

struct GenerationRequest {
  std::string request_id;               // unique per request
  std::vector<int32_t> prompt_tokens;   // already tokenized (chat template applied)
  SamplingParams sampling;
  int max_tokens = 16;                  // completion tokens, >= 1
  std::vector<std::string> stop;        // stop strings, matched on text, not emitted unless
  bool include_stop_str_in_output = false;  // ... this is set
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
  int n = 1;                            // parallel samples; they share the prompt's blocks
  bool skip_special_tokens = true;      // in the returned text
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

}  // namespace fp8serve
