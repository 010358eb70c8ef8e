#pragma once
// `fp8serve generate MODEL --prompt TEXT [flags]`: offline generation through the same Engine
// the server drives (a batch of one). Streams the text to stdout; one summary line to stderr.
#include "config/config.hpp"

namespace fp8serve {

// Returns the process exit code (0, or 1 when the request finished with an error).
int run_generate(const Config& config);

}  // namespace fp8serve
