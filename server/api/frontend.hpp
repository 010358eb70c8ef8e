#pragma once
// The OpenAI front end without sockets: ApiFrontend::handle(request) answers every route that
// needs no generation (health, models, metrics, tokenize, every error) with an HttpReply, and
// turns a valid completion request into a GenerationJob — tokenized GenerationRequests plus the
// ResponseBuilder that shapes the engine's outputs — which the HTTP session then runs. Tests
// call handle() directly (STYLE: a pure handle_request that needs no socket).
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "model/chat_template/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "server/api/engine_client.hpp"
#include "server/api/errors.hpp"
#include "server/api/request.hpp"
#include "server/api/response_store.hpp"
#include "server/api/responses.hpp"
#include "server/api/structured_output.hpp"
#include "server/api/tool_calls.hpp"
#include "server/metrics.hpp"

namespace fp8serve {

struct HttpRequestIn {
  std::string method;
  std::string target;          // path and optional query
  std::string authorization;   // the Authorization header, verbatim
  std::string content_type;
  std::string body;
  std::string request_id;      // assigned by the HTTP layer, echoed in X-Request-Id
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Retry-After, Allow)
};

HttpReply error_reply(const ApiError& error);
HttpReply json_reply(const nlohmann::ordered_json& body, int status = 200);

// What the loaded model contributes to the API. Pointers stay valid while the server runs.
struct ModelContext {
  std::string served_model_name;
  int max_model_len = 0;
  int max_num_seqs = 1;           // sequences that run at once: caps n; and the waiting-queue estimate
  std::string max_num_seqs_source = "--max-num-seqs";  // what sets it, for the error message
  bool priority_scheduling = false;  // --scheduling-policy priority: "priority" other than 0 is accepted
  int vocab_size = 0;             // the model's logits; 0 = the tokenizer's vocabulary
  int64_t max_pool_tokens = 0;    // tokens the whole KV pool holds; 0 = unchecked
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: the model ships none
  nlohmann::ordered_json template_extras = nlohmann::ordered_json::object();  // bos_token, eos_token
  EngineClient* engine = nullptr;
  // Structured outputs (response_format, tool_choice required / named); null: those get a 400.
  StructuredOutputs* structured = nullptr;
  ToolTemplateSupport tool_support;  // from the chat template and --tool-call-parser
};

struct FrontendOptions {
  std::string api_key;            // empty: no authentication
  bool metrics_public = false;
  int max_waiting_requests = 256;
  ApiLimits limits;
  ResponseStoreLimits responses_store;  // /v1/responses with store: true
};

struct GenerationJob {
  ApiKind kind = ApiKind::completion;
  std::vector<GenerationRequest> requests;  // one per prompt; choices index prompt * n + i
  std::unique_ptr<JobOutput> builder;
  int num_seqs = 0;                         // admitted sequences, released when the job ends
};

using RouteResult = std::variant<HttpReply, GenerationJob>;

class ApiFrontend {
 public:
  ApiFrontend(FrontendOptions options, ServerMetrics& metrics);

  // Once the model is loaded and the engine runs: /health turns 200, the API opens.
  void set_ready(ModelContext model);
  // SIGTERM: /health and every new generation get 503; running jobs finish.
  void set_draining();
  bool draining() const { return state_.load() == State::draining; }

  RouteResult handle(const HttpRequestIn& request);

  // A GenerationJob holds num_seqs admitted sequences until the session calls this.
  void release(int num_seqs);
  int in_flight_seqs() const { return in_flight_seqs_.load(); }
  EngineClient* engine() const { return model_ ? model_->engine : nullptr; }
  ServerMetrics& metrics() { return metrics_; }

 private:
  enum class State { loading, ready, draining };

  // render: vLLM's /v1/{completions,chat/completions}/render - the same checks, then the prompt
  // token ids as JSON instead of a job.
  RouteResult handle_generation(const HttpRequestIn& request, ApiKind kind, bool render = false);
  // Every check a generation makes, then its job; render: the prompt ids (JSON) instead.
  using Prepared = std::variant<GenerationJob, nlohmann::ordered_json, ApiError>;
  Prepared prepare_generation(const std::string& request_id, ApiRequest& r, ApiKind kind, bool render);
  // OpenAI's Responses API (frontend_responses.cpp): POST /v1/responses runs as the chat request
  // it translates to; the stored responses are read and deleted by id.
  RouteResult handle_responses(const HttpRequestIn& request);
  HttpReply handle_stored_response(const HttpRequestIn& request, const std::string& rest);
  HttpReply handle_tokenize(const HttpRequestIn& request);
  HttpReply handle_detokenize(const HttpRequestIn& request);
  std::optional<ApiError> check_utility_body(const nlohmann::ordered_json& body, const std::vector<std::string>& known) const;
  HttpReply handle_models() const;
  HttpReply handle_model(const std::string& id) const;  // GET /v1/models/{id}
  nlohmann::ordered_json model_card() const;
  bool authorized(const std::string& authorization) const;
  // Renders a chat request's messages with the model's chat template: the prompt text, or a 400.
  std::variant<std::string, ApiError> render_chat(const ApiRequest& r) const;
  // Every token id the request names (prompt, stop_token_ids, logit_bias, allowed_token_ids)
  // must index the model's logits.
  std::optional<ApiError> check_token_ids(const ApiRequest& r) const;
  int vocab_size() const;
  TokenBytesFn token_bytes_fn() const;  // a token's own bytes, for logprobs
  // 400 for a request that can never fit; 503 + Retry-After while the queue is full.
  std::optional<ApiError> admit(int num_seqs, int num_prompts, const ApiRequest& r);

  FrontendOptions options_;
  ServerMetrics& metrics_;
  std::atomic<State> state_{State::loading};
  std::optional<ModelContext> model_;  // set once, before state_ becomes ready
  std::atomic<int> in_flight_seqs_{0};
  ResponseStore responses_;
  int64_t created_ = 0;
};

}  // namespace fp8serve
