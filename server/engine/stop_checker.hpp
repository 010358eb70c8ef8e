#pragma once
// Stop strings, matched on the generated text across token boundaries. Text that might still
// turn into a stop string is held back, so a streaming client never sees part of one, and the
// stop string itself is not emitted (OpenAI semantics) unless include_stop (vLLM's
// include_stop_str_in_output) asks for it.
#include <string>
#include <string_view>
#include <vector>

namespace fp8serve {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string emit;     // text that is final and may be sent now
    bool stopped = false; // a stop string matched; generation must end
  };

  // Adds newly decoded text (valid UTF-8). After a stop, further calls emit nothing.
  // match = false (vLLM's min_tokens not reached yet): no stop string is looked for, and this
  // text with what was held back is emitted at once.
  Result push(std::string_view text, bool match = true);
  // End of generation without a stop: releases the text held back.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // not yet emitted: may be the start of a stop string
  bool include_stop_ = false;
  bool stopped_ = false;
};

}  // namespace fp8serve
