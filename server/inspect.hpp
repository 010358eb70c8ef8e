#pragma once
#include "config/config.hpp"

namespace fp8serve {

// `fp8serve inspect MODEL`: loads the model and prints what was loaded. Returns the exit code.
int run_inspect(const Config& config);

}  // namespace fp8serve
