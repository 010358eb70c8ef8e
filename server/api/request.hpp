#pragma once
// The OpenAI request bodies of /v1/completions and /v1/chat/completions, parsed and validated.
// Pure: no tokenizer, no engine. Every deterministic input error becomes a 400 ApiError naming
// the offending parameter; checks that need the model (token ids in the vocabulary, the context
// length) happen in the front end once the prompt is tokenized. Which fields exist at all, and
// which are rejected or ignored, is request_features.hpp's table.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"
#include "server/engine/sampling.hpp"

namespace fp8serve {

enum class ApiKind { completion, chat };

// Caps on what one request may ask for: they bound the work and memory a single request can
// cause, so the "huge n / huge stop list" requests are refused up front.
struct ApiLimits {
  int max_n = 16;
  int max_logprobs = 20;
  int max_stop = 16;
  int max_stop_bytes = 512;
  int max_prompts = 64;  // prompts in one completions request
  int max_json_depth = 64;
  int max_logit_bias = 1024;  // logit_bias entries
  // --ignore-request-fields: names no endpoint knows that are accepted, whatever their value, and
  // ignored (fields routers add); every other unknown field is a 400.
  std::vector<std::string> ignored_fields;
};

// One prompt of a completions request: either text or token ids.
struct PromptInput {
  std::optional<std::string> text;
  std::vector<int32_t> tokens;  // when text is empty
};

struct ApiRequest {
  ApiKind kind = ApiKind::completion;
  std::string model;                        // empty when the client did not name one
  std::vector<PromptInput> prompts;         // completion
  nlohmann::ordered_json messages;          // chat: array of message objects (text content)
  nlohmann::ordered_json tools;             // chat: null when absent (validated in tool_calls.cpp)
  nlohmann::ordered_json tool_choice;       // chat: null when absent (validated in tool_calls.cpp)
  bool parallel_tool_calls = true;          // chat
  nlohmann::ordered_json documents;         // chat: null when absent
  nlohmann::ordered_json response_format;   // null when absent (compiled in structured_output.cpp)
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  bool add_generation_prompt = true;        // chat
  bool continue_final_message = false;      // chat: the prompt ends inside the last message
  std::optional<bool> add_special_tokens;   // unset: true for completions, false for chat
  std::optional<int> truncate_prompt_tokens;  // keep the prompt's last N tokens
  std::optional<int> max_tokens;            // unset: completion 16, chat the rest of the context; 0 only with echo
  std::optional<int> prompt_logprobs;       // vLLM: each prompt token's logprob and the top N
  SamplingParams sampling;                  // logit_bias / allowed_token_ids ids not yet checked against the vocabulary
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  int n = 1;
  int best_of = 1;                          // >= n: choices generated; the n best are returned
  bool stream = false;
  bool include_usage = false;               // stream_options.include_usage
  bool echo = false;                        // completion: prepend the prompt to the text (and,
                                            // with logprobs, the prompt tokens' logprobs)
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool return_tokens_as_token_ids = false;  // logprobs tokens as "token_id:N"
  int priority = 0;                         // vLLM's: lower runs first (--scheduling-policy priority)
};

// Parses a JSON document with a nesting limit; malformed or too deep -> 400.
std::variant<nlohmann::ordered_json, ApiError> parse_json_body(std::string_view body, int max_depth);

std::variant<ApiRequest, ApiError> parse_api_request(std::string_view body, ApiKind kind,
                                                     const ApiLimits& limits = {});

}  // namespace fp8serve
