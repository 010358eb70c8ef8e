#pragma once
// What tests may switch in an Engine that no user can: the engine's one test hook (its friend).
#include "server/engine/engine.hpp"

namespace fp8serve {

struct EngineTestAccess {
  // The host samples every row, as on a backend without device sampling: tests compare the two.
  static void sample_on_host(Engine& engine) { engine.device_sampling_ = false; }
};

}  // namespace fp8serve
