#pragma once
// What the HTTP front end needs from the engine, as an interface: the serve command adapts the
// real AsyncEngine to it, and the front end's unit tests drive the HTTP layer with a scripted
// stand-in. The engine thread calls the OutputSink; the front end only enqueues there.
#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/engine_api.hpp"

namespace fp8serve {

// A snapshot of the engine's gauges and counters for /metrics.
struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  double kv_usage = 0.0;            // fraction of KV blocks in use, [0, 1]
  double kv_tail_usage = 0.0;       // bf16 window: fraction of tail rings owned by sequences, [0, 1]
  uint64_t kv_tail_tokens = 0;      // bf16 window: tokens its rings hold now
  uint64_t kv_ringless_seqs = 0;    // bf16 window: sequences that ran as pure FP8 for want of a ring
  uint64_t num_preemptions = 0;
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
};

class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // Queues the request; outputs arrive through `sink` on the engine thread, the last one with
  // `finish` set (for each of the n choices).
  virtual void submit(GenerationRequest request, OutputSink sink) = 0;
  // The client went away: free the request's blocks at the next step. Unknown ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
};

}  // namespace fp8serve
