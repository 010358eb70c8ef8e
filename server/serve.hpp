#pragma once
// `fp8serve serve MODEL [flags]`: the HTTP server in front of the engine. Binds first (so
// /health answers 503 while the model loads), loads the model, starts the engine thread, opens
// the API; on SIGTERM or SIGINT drains — new requests get 503, running ones finish within
// --shutdown-timeout — and returns 0.
#include "config/config.hpp"

namespace fp8serve {

int run_serve(const Config& config);

}  // namespace fp8serve
