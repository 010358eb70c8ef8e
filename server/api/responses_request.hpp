#pragma once
// OpenAI's Responses API, the request side: a /v1/responses body checked against its field
// table (request_features.hpp) and translated into the chat-completions request it runs as, so
// sampling, structured outputs, tools, logprobs and every limit are chat's. The conversation is
// kept as Responses items (messages, function calls, their outputs): what the store holds and
// what a continuation (previous_response_id) renders again. Pure: no tokenizer, no engine.
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"
#include "server/api/request.hpp"

namespace fp8serve {

struct ResponsesRequest {
  nlohmann::ordered_json chat;         // the chat body it runs as, `messages` still to be added
  nlohmann::ordered_json input_items;  // this request's input, normalized, each item with an id
  std::optional<std::string> instructions;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool stream = false;
  nlohmann::ordered_json echo;         // the settings the response object repeats, in OpenAI's order
};

// `id_seed` (the request id) names the input items that come without an id.
std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body, const ApiLimits& limits,
                                                                 const std::string& id_seed);

// Responses items (normalized) -> chat messages: `developer` renders as `system`; function calls
// join the assistant message before them (one message per run of calls); a function call's output
// is a `tool` message.
nlohmann::ordered_json items_to_messages(const nlohmann::ordered_json& items, const std::optional<std::string>& instructions);

// A chat-side error of a translated request, its parameter named as the Responses API names it
// (max_completion_tokens -> max_output_tokens, response_format -> text.format, messages -> input).
ApiError responses_error(ApiError chat_error);

}  // namespace fp8serve
