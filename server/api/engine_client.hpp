#pragma once
// What the HTTP front end needs from the engine, as an interface: the serve command adapts the
// real AsyncEngine to it, and the front end's unit tests drive the HTTP layer with a scripted
// stand-in. The engine thread calls the OutputSink; the front end only enqueues there.
#include <cstdint>
#include <string>
#include <vector>

#include "server/engine/engine_api.hpp"

namespace fp8serve {

class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // Queues the request; outputs arrive through `sink` on the engine thread, the last one with
  // `finish` set (for each of the n choices).
  virtual void submit(GenerationRequest request, OutputSink sink) = 0;
  // The client went away: free the request's blocks at the next step. Unknown ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
  // POST /reset_prefix_cache: the prefix cache drops every block between two steps (running
  // requests keep theirs); returns once it has.
  virtual void reset_prefix_cache() = 0;
};

}  // namespace fp8serve
