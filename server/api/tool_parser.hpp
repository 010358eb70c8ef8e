#pragma once
// The model's tool calls, parsed out of its text as it streams, into OpenAI's shape:
// message.tool_calls [{id, type: "function", function: {name, arguments: "<JSON text>"}}] and,
// when streaming, the deltas OpenAI sends (the first names the call, later ones append to its
// arguments). Non-streaming responses run the same parser over the whole text, so both forms
// always agree.
//
// Formats (vLLM's --tool-call-parser names):
//   hermes       Hermes / Qwen:  text <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...
//   llama3_json  Llama 3.x:      [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]
// A call that does not parse stays in the text, as the model wrote it.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fp8serve {

enum class ToolCallFormat { hermes, llama3_json };

std::optional<ToolCallFormat> parse_tool_call_format(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);

struct ToolCallDelta {
  std::string content;
  nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // OpenAI delta items
  bool empty() const { return content.empty() && tool_calls.empty(); }
  void append(ToolCallDelta other);
};

class ToolCallStream {
 public:
  // `id_seed` makes the call ids unique (the response id and choice index). `max_calls` > 0
  // keeps only that many calls (parallel_tool_calls: false): later ones are read and dropped.
  ToolCallStream(ToolCallFormat format, std::string id_seed, int max_calls = 0);

  ToolCallDelta push(std::string_view text);
  // End of generation: what was held back (a partial tag, an unfinished call) is released.
  ToolCallDelta finish();

  int num_calls() const;
  // After finish(): the text ended inside a call (max_tokens cut it).
  bool ended_inside_call() const { return ended_inside_call_; }
  // After finish(): the text outside the calls (trimmed when there are calls), and the calls.
  std::string content() const;
  nlohmann::ordered_json tool_calls() const;

 private:
  enum class Mode { undecided, content, call };
  struct Call {
    std::string id, name;
    std::string arguments;     // streamed so far
    bool header_sent = false;  // the delta naming the call went out
    bool dropped = false;      // beyond max_calls: read, never sent
  };

  void step(ToolCallDelta& out, bool at_end);
  bool step_content(ToolCallDelta& out, bool at_end);
  bool step_call(ToolCallDelta& out, bool at_end);
  void emit_content(ToolCallDelta& out, std::string_view text);
  void open_call();

  ToolCallFormat format_;
  std::string id_seed_;
  Mode mode_;
  std::string buffer_;        // text not yet consumed
  std::string content_;       // all content emitted
  std::string held_spaces_;   // whitespace after a call, emitted only if more text follows
  std::vector<Call> calls_;
  int max_calls_;
  bool ended_inside_call_ = false;
};

}  // namespace fp8serve
