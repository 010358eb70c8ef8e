#pragma once
// Builds the OpenAI response bodies from the engine's RequestOutputs: the final JSON of a
// non-streaming request, or the server-sent events of a streaming one (text_completion /
// chat.completion.chunk chunks, the usage chunk, `data: [DONE]`). Pure: token strings for
// logprobs come from a callback, so tests need no tokenizer.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"
#include "server/api/request.hpp"
#include "server/api/tool_parser.hpp"
#include "server/engine/engine_api.hpp"

namespace fp8serve {

// Serializes a response body; invalid UTF-8 (a client's bytes echoed in an error message, a
// token cut inside a character) becomes U+FFFD instead of an exception.
std::string dump_json(const nlohmann::ordered_json& value);
std::string dump_json(const nlohmann::json& value);

std::string sse_event(const nlohmann::ordered_json& value);  // "data: {...}\n\n"
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// The raw bytes one token contributes to the text (may be part of a UTF-8 character).
using TokenBytesFn = std::function<std::string(int32_t token)>;

struct ResponseMeta {
  ApiKind kind = ApiKind::completion;
  std::string id;             // cmpl-... / chatcmpl-...
  int64_t created = 0;        // unix seconds
  std::string model;
  int n = 1;                  // choices per prompt returned
  int best_of = 1;            // choices per prompt generated (>= n); the n best are returned
  int num_prompts = 1;
  bool stream = false;
  bool include_usage = false;
  int num_logprobs = -1;      // -1: logprobs not requested
  bool tokens_as_ids = false; // logprobs tokens as "token_id:N" (vLLM's return_tokens_as_token_ids)
  std::vector<std::string> echo_texts;  // completion echo: the prompt text of each prompt
  bool echo_logprobs = false;           // echo with logprobs: the prompt's tokens lead the logprobs object
  int num_prompt_logprobs = -1;         // vLLM's prompt_logprobs: -1 not requested
  std::vector<std::vector<int32_t>> prompt_ids;  // per prompt, when either of the two is asked for
  std::vector<int> prompt_tokens;       // per prompt
  std::optional<ToolCallFormat> tool_parser;  // chat with tools: calls are read out of the text
  int max_tool_calls = 0;                     // 1 with parallel_tool_calls: false; 0 any number
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

// What the HTTP session runs a GenerationJob through: the engine's outputs in, the response's
// bytes out. ResponseBuilder shapes completions and chat; ResponsesBuilder (responses_api.hpp)
// shapes /v1/responses.
class JobOutput {
 public:
  virtual ~JobOutput() = default;
  // The chat or completions request the job was prepared as (stream, tools, logprobs).
  virtual const ResponseMeta& meta() const = 0;
  // Stream mode: the events to send before the first output.
  virtual std::vector<std::string> stream_head() = 0;
  // Consumes one output of prompt `prompt_index`; in stream mode returns the events to send now.
  virtual std::vector<std::string> on_output(int prompt_index, const RequestOutput& output) = 0;
  virtual bool done() const = 0;
  // The first error an output reported (finish == error), if any.
  virtual const std::optional<std::string>& engine_error() const = 0;
  // Stream mode, after done() without an engine error: the closing events.
  virtual std::vector<std::string> stream_tail() = 0;
  // Stream mode, after an engine error: the events that report it.
  virtual std::vector<std::string> stream_error(const std::string& request_id);
  // Non-stream mode, after done(): the whole response object.
  virtual nlohmann::ordered_json final_body() = 0;
  virtual Usage usage() const = 0;
  // One word for the access log and the success counter: error > abort > length > stop.
  virtual std::string summary_finish() const = 0;
  // The job ended; `client_gone`: the client left before its end.
  virtual void finished(bool /*client_gone*/) {}
};

// The OpenAI chat logprobs items (`logprobs.content`, also the Responses API's) of these tokens.
nlohmann::ordered_json token_logprob_items(const std::vector<SampleResult>& samples, const TokenBytesFn& token_bytes,
                                           bool tokens_as_ids);

class ResponseBuilder final : public JobOutput {
 public:
  ResponseBuilder(ResponseMeta meta, TokenBytesFn token_bytes);

  // Consumes one output of prompt `prompt_index` (output.index < best_of). In stream mode returns
  // the SSE events to send now (possibly none); otherwise accumulates and returns nothing.
  std::vector<std::string> on_output(int prompt_index, const RequestOutput& output) override;

  bool done() const override { return num_finished_ == static_cast<int>(choices_.size()); }
  const std::optional<std::string>& engine_error() const override { return engine_error_; }
  Usage usage() const override;
  std::string summary_finish() const override;
  const ResponseMeta& meta() const override { return meta_; }

  // Stream mode, after done(): the usage chunk (when asked for) and `data: [DONE]`.
  std::vector<std::string> stream_tail() override;
  // Non-stream mode, after done(): the whole response object; with best_of > n, each prompt's n
  // choices of highest cumulative logprob, best first (ties: generation order).
  nlohmann::ordered_json final_body() override;
  // The first stream events: the role chunk of every chat choice, the echoed prompt.
  std::vector<std::string> stream_head() override;

 private:
  struct Choice {
    std::string text;
    nlohmann::ordered_json logprobs;  // null, or the accumulated logprobs object
    std::optional<FinishReason> finish;
    int completion_tokens = 0;
    int text_offset = 0;              // completion logprobs: bytes of token text so far
    double cumulative_logprob = 0;    // of the chosen tokens (best_of ranks by it)
    std::shared_ptr<ToolCallStream> tools;  // streaming with a tool parser
    bool started = false;             // an output arrived (the first carries the prompt logprobs)
    nlohmann::ordered_json prompt_logprobs;  // vLLM's prompt_logprobs list, or null
  };

  nlohmann::ordered_json chunk_base() const;
  nlohmann::ordered_json logprobs_delta(Choice& choice, const RequestOutput& output);
  // The prompt's tokens in the completions logprobs format (echo with logprobs), from the first
  // output of a choice; the text offsets of the generated tokens continue after them.
  nlohmann::ordered_json echo_logprobs(Choice& choice, int prompt_index, const RequestOutput& output);
  // vLLM's prompt_logprobs: [null, {"id": {"logprob", "rank", "decoded_token"}, ...}, ...].
  nlohmann::ordered_json vllm_prompt_logprobs(int prompt_index, const RequestOutput& output) const;
  static void append_logprobs(nlohmann::ordered_json& into, const nlohmann::ordered_json& delta, ApiKind kind);
  nlohmann::ordered_json usage_json() const;
  std::string token_text(int32_t token, const std::string& bytes) const;
  std::vector<int> returned_choices(int prompt_index) const;  // indices into choices_

  ResponseMeta meta_;
  TokenBytesFn token_bytes_;
  std::vector<Choice> choices_;       // [num_prompts * best_of]
  std::vector<int> cached_tokens_;    // per prompt, as the engine reported
  int num_finished_ = 0;
  std::optional<std::string> engine_error_;
};

const char* finish_reason_name(FinishReason reason);

}  // namespace fp8serve
