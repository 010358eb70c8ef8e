#include "server/api/frontend.hpp"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstring>
#include <ctime>

namespace fp8serve {

using Json = nlohmann::ordered_json;

HttpReply error_reply(const ApiError& error) {
  HttpReply reply;
  reply.status = error.status;
  reply.body = dump_json(error_body(error));
  if (error.retry_after_s > 0) reply.headers.emplace_back("Retry-After", std::to_string(error.retry_after_s));
  return reply;
}

HttpReply json_reply(const Json& body, int status) {
  HttpReply reply;
  reply.status = status;
  reply.body = dump_json(body);
  return reply;
}

namespace {

std::string path_of(const std::string& target) { return target.substr(0, target.find('?')); }

// "%2F" -> "/": a model id in the path may be percent-encoded by the client. Malformed escapes
// stay as they are.
std::string percent_decode(const std::string& s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
      out += static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool is_json_content_type(const std::string& value) {
  std::string media = value.substr(0, value.find(';'));
  while (!media.empty() && media.back() == ' ') media.pop_back();
  for (char& c : media) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return media == "application/json";
}

ApiError unsupported_media_type() {
  return ApiError{415, "Content-Type must be application/json.", "invalid_request_error", {}, "unsupported_media_type", 0};
}

ApiError context_exceeded(int max_model_len, int prompt, int completion, ApiKind kind) {
  return bad_request("This model's maximum context length is " + std::to_string(max_model_len) +
                         " tokens. However, you requested " + std::to_string(prompt + completion) + " tokens (" +
                         std::to_string(prompt) + " in the prompt, " + std::to_string(completion) +
                         " in the completion). Please reduce the length of the prompt or the completion.",
                     kind == ApiKind::chat ? "messages" : "prompt", "context_length_exceeded");
}

}  // namespace

ApiFrontend::ApiFrontend(FrontendOptions options, ServerMetrics& metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      responses_(options_.responses_store),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void ApiFrontend::set_ready(ModelContext model) {
  model_ = std::move(model);
  state_.store(State::ready, std::memory_order_release);
}

void ApiFrontend::set_draining() { state_.store(State::draining, std::memory_order_release); }

void ApiFrontend::release(int num_seqs) { in_flight_seqs_.fetch_sub(num_seqs); }

bool ApiFrontend::authorized(const std::string& authorization) const {
  if (options_.api_key.empty()) return true;
  static constexpr std::string_view kBearer = "Bearer ";
  const std::string given = authorization.rfind(kBearer, 0) == 0 ? authorization.substr(kBearer.size()) : std::string();
  // Compare digests so the time taken reveals neither the key's bytes nor its length.
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(options_.api_key.data()), options_.api_key.size(), b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0 && !given.empty();
}

std::optional<ApiError> ApiFrontend::admit(int num_seqs, int num_prompts, const ApiRequest& r) {
  // A request larger than everything the server can hold at once would get 503 forever: that
  // is the client's to fix, a 400 naming the limits.
  const int capacity = model_->max_num_seqs + options_.max_waiting_requests;
  if (num_seqs > capacity) {
    std::string what = std::to_string(num_prompts) + " prompt" + (num_prompts == 1 ? "" : "s");
    if (r.n > 1) what += " x n=" + std::to_string(r.n);
    if (r.best_of > r.n) what += " (best_of=" + std::to_string(r.best_of) + ")";
    const std::string n = std::to_string(model_->max_num_seqs);
    const std::string running = model_->max_num_seqs_source == "--max-num-seqs"
                                    ? "--max-num-seqs " + n + " running"
                                    : n + " running (" + model_->max_num_seqs_source + ")";
    return bad_request("This request needs " + std::to_string(num_seqs) + " sequences (" + what +
                           ") but the server holds at most " + std::to_string(capacity) + " at once (" + running +
                           " + --max-waiting-requests " +
                           std::to_string(options_.max_waiting_requests) + " waiting): split it into smaller requests.",
                       r.best_of > 1 ? (r.best_of > r.n ? "best_of" : "n") : "prompt", "request_too_large");
  }
  // Running sequences are at most max_num_seqs, so whatever is in flight beyond that waits:
  // an upper estimate of the queue that needs nothing from the engine thread.
  const int after = in_flight_seqs_.fetch_add(num_seqs) + num_seqs;
  if (after - model_->max_num_seqs > options_.max_waiting_requests) {
    in_flight_seqs_.fetch_sub(num_seqs);
    return service_unavailable("The server is at capacity (waiting queue full); retry shortly.", 1);
  }
  return std::nullopt;
}

RouteResult ApiFrontend::handle(const HttpRequestIn& request) {
  const std::string path = path_of(request.target);
  const State state = state_.load(std::memory_order_acquire);
  const std::string& method = request.method;

  // HEAD is GET without the body (the HTTP layer drops it): RFC 9110 §9.3.2.
  struct Route {
    const char* path;
    const char* methods;  // "GET" or "GET, DELETE"
    bool prefix;          // /v1/models/{id}, /v1/responses/{id}[/input_items]
  };
  static constexpr Route kRoutes[] = {{"/health", "GET", false},          {"/v1/models", "GET", false},
                                      {"/v1/models/", "GET", true},       {"/metrics", "GET", false},
                                      {"/v1/completions", "POST", false}, {"/v1/chat/completions", "POST", false},
                                      {"/tokenize", "POST", false},       {"/detokenize", "POST", false},
                                      {"/v1/completions/render", "POST", false},
                                      {"/v1/chat/completions/render", "POST", false},
                                      {"/reset_prefix_cache", "POST", false},
                                      {"/v1/responses", "POST", false},
                                      {"/v1/responses/", "GET, DELETE", true}};
  const Route* route = nullptr;
  for (const Route& r : kRoutes)
    if (r.prefix ? path.size() > std::strlen(r.path) && path.rfind(r.path, 0) == 0 : path == r.path) route = &r;
  if (route == nullptr) return error_reply(not_found("Route " + path + " not found.", "not_found"));
  const std::string_view methods = route->methods;
  auto allows = [&](std::string_view m) {
    for (size_t at = methods.find(m); at != std::string_view::npos; at = methods.find(m, at + 1))
      if ((at == 0 || methods[at - 1] == ' ') && (at + m.size() == methods.size() || methods[at + m.size()] == ','))
        return true;
    return false;
  };
  const bool get_route = allows("GET");
  if (method.empty() || (!allows(method) && !(get_route && method == "HEAD"))) {
    HttpReply reply = error_reply(method_not_allowed(method, path));
    reply.headers.emplace_back("Allow", get_route ? std::string(methods) + ", HEAD" : std::string(methods));
    return reply;
  }
  if (path == "/health") {
    if (state == State::ready) return HttpReply{200, "application/json", "{}", {}};
    return error_reply(service_unavailable(state == State::loading ? "The model is loading." : "The server is shutting down.", 1));
  }
  if (!authorized(request.authorization) && !(path == "/metrics" && options_.metrics_public)) return error_reply(unauthorized());
  if (state == State::loading) return error_reply(service_unavailable("The model is loading; retry shortly.", 5));
  if (path == "/metrics") {
    HttpReply reply;
    reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
    reply.body = metrics_.render(model_->engine != nullptr ? model_->engine->stats() : EngineStats{});
    return reply;
  }
  if (path == "/v1/models") return handle_models();
  if (route->prefix && path.rfind("/v1/responses/", 0) == 0)
    return handle_stored_response(request, percent_decode(path.substr(std::strlen(route->path))));
  if (route->prefix) return handle_model(percent_decode(path.substr(std::strlen(route->path))));
  if (path == "/reset_prefix_cache") {  // vLLM's: no body; a router sees AllBlocksCleared
    model_->engine->reset_prefix_cache();
    return HttpReply{200, "application/json", "{}", {}};
  }
  if (!is_json_content_type(request.content_type)) return error_reply(unsupported_media_type());
  if (path == "/tokenize") return handle_tokenize(request);
  if (path == "/detokenize") return handle_detokenize(request);
  if (path == "/v1/completions/render") return handle_generation(request, ApiKind::completion, /*render=*/true);
  if (path == "/v1/chat/completions/render") return handle_generation(request, ApiKind::chat, /*render=*/true);
  if (state == State::draining) return error_reply(service_unavailable("The server is shutting down.", 5));
  if (path == "/v1/responses") return handle_responses(request);
  return handle_generation(request, path == "/v1/completions" ? ApiKind::completion : ApiKind::chat);
}

Json ApiFrontend::model_card() const {
  return {{"id", model_->served_model_name}, {"object", "model"},        {"created", created_},
          {"owned_by", "fp8serve"},           {"root", model_->served_model_name}, {"parent", nullptr},
          {"max_model_len", model_->max_model_len}};
}

HttpReply ApiFrontend::handle_models() const { return json_reply({{"object", "list"}, {"data", Json::array({model_card()})}}); }

HttpReply ApiFrontend::handle_model(const std::string& id) const {
  if (id != model_->served_model_name) return error_reply(not_found("The model '" + id + "' does not exist.", "model_not_found"));
  return json_reply(model_card());
}

std::variant<std::string, ApiError> ApiFrontend::render_chat(const ApiRequest& r) const {
  if (model_->chat_template == nullptr)
    return bad_request("This model has no chat template: use /v1/completions, or start the server with --chat-template FILE.",
                       "messages");
  Json extras = model_->template_extras;
  if (!r.documents.is_null()) extras["documents"] = r.documents;
  for (const auto& [key, value] : r.template_kwargs.items()) extras[key] = value;
  ChatTemplateOptions options;
  const std::time_t now = std::time(nullptr);
  localtime_r(&now, &options.now);
  const Json context = make_chat_context(r.messages, r.tools, r.add_generation_prompt, extras);
  ChatTemplateResult result = r.continue_final_message
                                  ? render_continuing_final_message(*model_->chat_template, context, options)
                                  : model_->chat_template->render(context, options);
  if (!result.ok()) return bad_request("The chat template rejected the messages: " + result.error->message, "messages");
  return std::move(result.text);
}

std::optional<ApiError> ApiFrontend::check_token_ids(const ApiRequest& r) const {
  const int vocab = vocab_size();
  auto outside = [&](int32_t id) { return id < 0 || id >= vocab; };
  const std::string size = " is out of vocabulary (size " + std::to_string(vocab) + ").";
  for (const int32_t id : r.stop_token_ids)
    if (outside(id)) return bad_request("'stop_token_ids': token id " + std::to_string(id) + size, "stop_token_ids");
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (outside(id)) return bad_request("'logit_bias': token id " + std::to_string(id) + size, "logit_bias");
  for (const int32_t id : r.sampling.allowed_token_ids)
    if (outside(id)) return bad_request("'allowed_token_ids': token id " + std::to_string(id) + size, "allowed_token_ids");
  for (const PromptInput& p : r.prompts)
    for (const int32_t id : p.tokens)
      if (outside(id)) return bad_request("Token id " + std::to_string(id) + size, "prompt");
  return std::nullopt;
}

TokenBytesFn ApiFrontend::token_bytes_fn() const {
  const Tokenizer* tok = model_->tokenizer;
  return [tok](int32_t id) {
    std::string bytes;
    bool at_start = false;  // a token's own bytes, dummy-prefix space kept
    tok->append_token_bytes(id, /*skip_special_tokens=*/false, at_start, bytes);
    return bytes;
  };
}

int ApiFrontend::vocab_size() const {
  const int tokenizer_vocab = model_->tokenizer->vocab_size();
  return model_->vocab_size > 0 ? std::min(tokenizer_vocab, model_->vocab_size) : tokenizer_vocab;
}

RouteResult ApiFrontend::handle_generation(const HttpRequestIn& request, ApiKind kind, bool render) {
  auto parsed = parse_api_request(request.body, kind, options_.limits);
  if (auto* error = std::get_if<ApiError>(&parsed)) return error_reply(*error);
  Prepared prepared = prepare_generation(request.request_id, std::get<ApiRequest>(parsed), kind, render);
  if (auto* error = std::get_if<ApiError>(&prepared)) return error_reply(*error);
  if (auto* rendered = std::get_if<Json>(&prepared)) return json_reply(*rendered);
  return std::move(std::get<GenerationJob>(prepared));
}

ApiFrontend::Prepared ApiFrontend::prepare_generation(const std::string& request_id, ApiRequest& r, ApiKind kind, bool render) {
  if (!r.model.empty() && r.model != model_->served_model_name)
    return not_found("The model '" + r.model + "' does not exist.", "model_not_found");
  if (auto error = check_token_ids(r)) return *error;

  const Tokenizer& tokenizer = *model_->tokenizer;
  // Tokenized prompts and, for echo, their text.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  ToolSetup tools;
  if (kind == ApiKind::chat) {
    auto prepared = prepare_tools(r, model_->tool_support, model_->structured);
    if (auto* error = std::get_if<ApiError>(&prepared)) return *error;
    tools = std::move(std::get<ToolSetup>(prepared));
    r.messages = std::move(tools.messages);  // as the template renders them (tool_calls.hpp)
    r.tools = std::move(tools.tools);
    auto rendered = render_chat(r);
    if (auto* error = std::get_if<ApiError>(&rendered)) return *error;
    // The template already wrote the special tokens (BOS) it wants, as vLLM does for chat.
    prompts.push_back(tokenizer.encode(std::get<std::string>(rendered), r.add_special_tokens.value_or(false)));
    texts.push_back(std::get<std::string>(rendered));
  } else {
    for (const PromptInput& p : r.prompts) {
      if (p.text) {
        prompts.push_back(tokenizer.encode(*p.text, r.add_special_tokens.value_or(true)));
        texts.push_back(*p.text);
      } else {
        prompts.push_back(p.tokens);
        texts.push_back(tokenizer.decode(p.tokens, /*skip_special_tokens=*/false));
      }
    }
  }
  if (r.truncate_prompt_tokens) {
    // vLLM's semantics: keep the last N tokens; echo then shows what the model saw.
    for (size_t p = 0; p < prompts.size(); ++p) {
      if (static_cast<int>(prompts[p].size()) <= *r.truncate_prompt_tokens) continue;
      prompts[p].erase(prompts[p].begin(), prompts[p].end() - *r.truncate_prompt_tokens);
      texts[p] = tokenizer.decode(prompts[p], /*skip_special_tokens=*/false);
    }
  }
  GrammarPtr grammar = tools.grammar;
  if (!r.response_format.is_null()) {
    if (model_->structured == nullptr)
      return bad_request("'response_format' needs structured outputs, which this server has not set up.", "response_format");
    auto format = model_->structured->for_response_format(r.response_format);
    if (auto* error = std::get_if<ApiError>(&format)) return *error;
    if (GrammarPtr g = std::get<GrammarPtr>(format)) {
      if (grammar)
        return bad_request("'response_format' and 'tool_choice' (required or a named function) cannot both "
                                       "constrain one answer; use one of them.",
                                       "response_format");
      grammar = std::move(g);
    }
  }

  if (r.priority != 0 && !model_->priority_scheduling)
    return bad_request("'priority' needs priority scheduling: start the server with --scheduling-policy priority "
                                   "(this one serves first come, first served).",
                                   "priority");
  for (const auto& [value, name] : {std::pair{r.n, "n"}, std::pair{r.best_of, "best_of"}})
    if (value > model_->max_num_seqs)
      return bad_request("'" + std::string(name) + "' must be at most " + std::to_string(model_->max_num_seqs) +
                                         " (" + model_->max_num_seqs_source + ").",
                                     name);
  const int max_len = model_->max_model_len;
  std::vector<int> max_tokens(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int prompt_len = static_cast<int>(prompts[p].size());
    if (prompt_len == 0) return bad_request("The prompt is empty after tokenization.", "prompt");
    // Unset: 16 for completions (OpenAI's default), the rest of the context for chat (vLLM's).
    const int wanted = r.max_tokens.value_or(kind == ApiKind::completion ? 16 : std::max(1, max_len - prompt_len));
    if (static_cast<int64_t>(prompt_len) + wanted > max_len) return context_exceeded(max_len, prompt_len, wanted, kind);
    if (r.sampling.min_tokens > wanted)
      return bad_request("'min_tokens' (" + std::to_string(r.sampling.min_tokens) + ") must not exceed max_tokens (" +
                                         std::to_string(wanted) + ").",
                                     "min_tokens");
    if (model_->max_pool_tokens > 0 && static_cast<int64_t>(prompt_len) + wanted > model_->max_pool_tokens)
      return bad_request("The prompt plus max_tokens (" + std::to_string(prompt_len + wanted) +
                                         " tokens) exceeds what the whole KV cache holds (" +
                                         std::to_string(model_->max_pool_tokens) + " tokens).",
                                     "max_tokens", "context_length_exceeded");
    max_tokens[p] = wanted;
  }

  if (render) {
    // vLLM's render endpoints: the token ids this very request would run, after every check a
    // generation makes, and nothing generated (routers score replicas by them). Completions: one
    // object per prompt; chat: one object.
    const std::string id = (kind == ApiKind::chat ? "chatcmpl-" : "cmpl-") + request_id;
    Json rendered = Json::array();
    for (size_t p = 0; p < prompts.size(); ++p)
      rendered.push_back({{"request_id", prompts.size() == 1 ? id : id + "-" + std::to_string(p)},
                          {"token_ids", prompts[p]},
                          {"features", nullptr}});
    return kind == ApiKind::chat ? rendered[0] : rendered;
  }

  // best_of > n: every candidate is a sequence; the n best (by cumulative logprob, which the
  // sampler then computes for the chosen tokens) are returned by the ResponseBuilder.
  const int num_seqs = static_cast<int>(prompts.size()) * r.best_of;
  if (auto error = admit(num_seqs, static_cast<int>(prompts.size()), r)) return *error;
  SamplingParams sampling = r.sampling;
  if (r.best_of > r.n) sampling.num_logprobs = std::max(sampling.num_logprobs, 0);

  ResponseMeta meta;
  meta.kind = kind;
  meta.id = (kind == ApiKind::chat ? "chatcmpl-" : "cmpl-") + request_id;
  meta.created = static_cast<int64_t>(std::time(nullptr));
  meta.model = model_->served_model_name;
  meta.n = r.n;
  meta.best_of = r.best_of;
  meta.num_prompts = static_cast<int>(prompts.size());
  meta.stream = r.stream;
  meta.include_usage = r.include_usage;
  meta.num_logprobs = r.sampling.num_logprobs;
  meta.tokens_as_ids = r.return_tokens_as_token_ids;
  meta.tool_parser = tools.parse;
  meta.max_tool_calls = r.parallel_tool_calls ? 0 : 1;
  if (r.echo) meta.echo_texts = texts;
  // Prompt logprobs: echo with logprobs (in the logprobs object) and vLLM's prompt_logprobs
  // (their own field) are computed once, with the larger of the two top-N.
  meta.echo_logprobs = r.echo && r.sampling.num_logprobs >= 0;
  meta.num_prompt_logprobs = r.prompt_logprobs.value_or(-1);
  const int num_prompt_logprobs = std::max(meta.num_prompt_logprobs, meta.echo_logprobs ? r.sampling.num_logprobs : -1);
  if (num_prompt_logprobs >= 0) meta.prompt_ids = prompts;
  for (const auto& p : prompts) meta.prompt_tokens.push_back(static_cast<int>(p.size()));

  GenerationJob job;
  job.kind = kind;
  job.num_seqs = num_seqs;
  job.builder = std::make_unique<ResponseBuilder>(std::move(meta), token_bytes_fn());
  for (size_t p = 0; p < prompts.size(); ++p) {
    GenerationRequest g;
    g.request_id = prompts.size() == 1 ? request_id : request_id + "-" + std::to_string(p);
    g.prompt_tokens = std::move(prompts[p]);
    g.sampling = sampling;
    g.max_tokens = max_tokens[p];
    g.num_prompt_logprobs = num_prompt_logprobs;
    g.stop = r.stop;
    g.include_stop_str_in_output = r.include_stop_str_in_output;
    g.stop_token_ids = r.stop_token_ids;
    g.ignore_eos = r.ignore_eos;
    g.priority = r.priority;
    g.n = r.best_of;
    g.skip_special_tokens = r.skip_special_tokens;
    g.grammar = grammar;
    job.requests.push_back(std::move(g));
  }
  return job;
}

// vLLM's /tokenize and /detokenize: unknown fields are refused here too, and `model`, when
// given, must be the served one.
std::optional<ApiError> ApiFrontend::check_utility_body(const Json& body, const std::vector<std::string>& known) const {
  if (!body.is_object()) return bad_request("the request body must be a JSON object.");
  for (const auto& [key, value] : body.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      return bad_request("Unknown parameter: '" + key + "'.", key, "unknown_parameter");
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("'model' must be a string.", "model");
    if (*it != model_->served_model_name)
      return not_found("The model '" + it->get<std::string>() + "' does not exist.", "model_not_found");
  }
  return std::nullopt;
}

HttpReply ApiFrontend::handle_tokenize(const HttpRequestIn& request) {
  auto doc = parse_json_body(request.body, options_.limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&doc)) return error_reply(*error);
  const Json& body = std::get<Json>(doc);
  const bool chat = body.is_object() && body.contains("messages");
  static const std::vector<std::string> kChatFields = {"model", "messages", "add_generation_prompt", "continue_final_message",
                                                       "chat_template_kwargs", "add_special_tokens", "tools", "tool_choice"};
  static const std::vector<std::string> kPromptFields = {"model", "prompt", "add_special_tokens"};
  if (auto error = check_utility_body(body, chat ? kChatFields : kPromptFields)) return error_reply(*error);
  std::string text;
  bool add_special = true;
  if (chat) {
    // Validate and render through the chat parser, so /tokenize accepts exactly what chat does,
    // tools included (the prompt a tool request really sends).
    Json chat_body = body;
    chat_body.erase("add_special_tokens");
    // required / named constrain the answer, not the prompt: rendered as auto.
    if (chat_body.contains("tool_choice") && chat_body["tool_choice"] != "none") chat_body["tool_choice"] = "auto";
    auto parsed = parse_api_request(dump_json(chat_body), ApiKind::chat, options_.limits);
    if (auto* error = std::get_if<ApiError>(&parsed)) return error_reply(*error);
    ApiRequest& chat_request = std::get<ApiRequest>(parsed);
    auto prepared = prepare_tools(chat_request, model_->tool_support, /*structured=*/nullptr);
    if (auto* error = std::get_if<ApiError>(&prepared)) return error_reply(*error);
    chat_request.messages = std::move(std::get<ToolSetup>(prepared).messages);
    chat_request.tools = std::move(std::get<ToolSetup>(prepared).tools);
    auto rendered = render_chat(chat_request);
    if (auto* error = std::get_if<ApiError>(&rendered)) return error_reply(*error);
    text = std::get<std::string>(rendered);
    add_special = false;
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) return error_reply(bad_request("'prompt' (a string) or 'messages' is required.", "prompt"));
    text = it->get<std::string>();
  }
  if (const auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return error_reply(bad_request("'add_special_tokens' must be a boolean.", "add_special_tokens"));
    add_special = it->get<bool>();
  }
  const std::vector<int32_t> tokens = model_->tokenizer->encode(text, add_special);
  return json_reply({{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", model_->max_model_len}});
}

HttpReply ApiFrontend::handle_detokenize(const HttpRequestIn& request) {
  auto doc = parse_json_body(request.body, options_.limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&doc)) return error_reply(*error);
  const Json& body = std::get<Json>(doc);
  static const std::vector<std::string> kFields = {"model", "tokens"};
  if (auto error = check_utility_body(body, kFields)) return error_reply(*error);
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return error_reply(bad_request("'tokens' (a list of token ids) is required.", "tokens"));
  std::vector<int32_t> ids;
  for (const Json& id : body["tokens"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= model_->tokenizer->vocab_size())
      return error_reply(bad_request("'tokens' must hold token ids in [0, " + std::to_string(model_->tokenizer->vocab_size()) + ").",
                                     "tokens"));
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return json_reply({{"prompt", model_->tokenizer->decode(ids, /*skip_special_tokens=*/false)}});
}

}  // namespace fp8serve
