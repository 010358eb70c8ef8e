#pragma once
// The one error type of the model-format layer. Loaders treat every file as hostile, so anything
// malformed, truncated or unsupported surfaces as a FormatError whose message names the
// offending key, tensor or value, never as a crash.
#include <stdexcept>
#include <string>

namespace fp8serve {

class FormatError : public std::runtime_error {
 public:
  explicit FormatError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace fp8serve
