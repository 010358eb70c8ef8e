#pragma once
// What tests may switch in an Engine that no user can: the engine's one test hook (its friend).
#include "server/engine/engine.hpp"

namespace fp8serve {

struct EngineTestAccess {
  // The host samples every row, as on a backend without device sampling: tests compare the two.
  static void sample_on_host(Engine& engine) { engine.device_sampling_ = false; }
  // The scheduler's and the block manager's invariants, the cache's keys against the tokens.
  static void check_integrity(const Engine& engine) { engine.scheduler_->check_integrity(); }
};

}  // namespace fp8serve
