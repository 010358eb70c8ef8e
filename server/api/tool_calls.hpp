#pragma once
// Tool calling on /v1/chat/completions, the request side: `tools`, `tool_choice` and
// `parallel_tool_calls` validated; the messages and tools the chat template gets; the parser
// that reads calls out of the answer; and, for tool_choice "required" or a named function, the
// grammar that constrains the answer to calls in the model's own format.
//
// Templates that render `tools` (Qwen, Llama 3.x, Hermes) get them as the client sent them.
// For templates that ignore tools (SmolLM2's), the tools are described in a system message in
// the chosen format, and past calls and tool results are written into the messages as text,
// so any chat model can be offered tools.
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"
#include "server/api/request.hpp"
#include "server/api/structured_output.hpp"
#include "server/api/tool_parser.hpp"

namespace fp8serve {

// What a chat template does with tools, decided once from its source.
struct ToolTemplateSupport {
  bool renders_tools = false;                  // it reads `tools` itself
  ToolCallFormat format = ToolCallFormat::hermes;
};

// `forced`: --tool-call-parser, when not "auto". Otherwise <tool_call> in the template means
// hermes, <|python_tag|> or ipython means llama3_json, and anything else hermes.
ToolTemplateSupport tool_template_support(const std::string& template_source, std::optional<ToolCallFormat> forced);

struct ToolSetup {
  nlohmann::ordered_json messages;             // what the template renders
  nlohmann::ordered_json tools;                // null: none for the template
  std::optional<ToolCallFormat> parse;         // read calls out of the answer
  GrammarPtr grammar;                          // tool_choice required / named
};

// `structured` may be null (no grammar support): required / named are then a 400.
std::variant<ToolSetup, ApiError> prepare_tools(const ApiRequest& request, const ToolTemplateSupport& support,
                                                StructuredOutputs* structured);

}  // namespace fp8serve
