#include "server/api/request.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "server/api/request_features.hpp"
#include "server/api/request_fields.hpp"

namespace fp8serve {

namespace {

using namespace api_detail;

struct TooDeep {};

std::vector<int32_t> token_list(const Json& v, const std::string& param) {
  if (v.empty()) reject(param, "'" + param + "' must not be an empty list of token ids.");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& id : v) ids.push_back(static_cast<int32_t>(Fields::as_integer(id, param, 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]
std::vector<PromptInput> parse_prompts(const Json* prompt, const ApiLimits& limits) {
  if (prompt == nullptr) reject("prompt", "'prompt' is required.");
  std::vector<PromptInput> out;
  if (prompt->is_string()) {
    if (prompt->get_ref<const std::string&>().empty()) reject("prompt", "'prompt' must not be empty.");
    out.push_back({prompt->get<std::string>(), {}});
    return out;
  }
  if (!prompt->is_array()) reject("prompt", "'prompt' must be a string, a list of strings or a list of token ids.");
  if (prompt->empty()) reject("prompt", "'prompt' must not be empty.");
  if (prompt->front().is_number()) {
    out.push_back({std::nullopt, token_list(*prompt, "prompt")});
    return out;
  }
  if (static_cast<int>(prompt->size()) > limits.max_prompts)
    reject("prompt", "at most " + std::to_string(limits.max_prompts) + " prompts per request.");
  for (const Json& item : *prompt) {
    if (item.is_string()) {
      if (item.get_ref<const std::string&>().empty()) reject("prompt", "'prompt' must not contain empty strings.");
      out.push_back({item.get<std::string>(), {}});
    } else if (item.is_array()) {
      out.push_back({std::nullopt, token_list(item, "prompt")});
    } else {
      reject("prompt", "'prompt' list items must be strings or lists of token ids, got " + type_name(item) + ".");
    }
  }
  return out;
}

// Text-only content: a string, or a list of {"type": "text", "text": ...} parts joined by
// newlines (what vLLM passes to string-content chat templates).
Json normalize_content(const Json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) reject(param, "'" + param + "' must be a string or a list of text parts.");
  std::string joined;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      reject(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported.");
    if (!joined.empty()) joined += '\n';
    joined += part["text"].get<std::string>();
  }
  return joined;
}

Json parse_messages(const Json* messages) {
  if (messages == nullptr) reject("messages", "'messages' is required.");
  if (!messages->is_array()) reject("messages", "'messages' must be a list of message objects.");
  if (messages->empty()) reject("messages", "'messages' must not be empty.");
  Json out = Json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) reject(param, "'" + param + "' must be an object.");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() || role->get_ref<const std::string&>().empty())
      reject(param + ".role", "'" + param + ".role' must be a non-empty string.");
    Json copy = m;
    if (auto content = m.find("content"); content != m.end()) copy["content"] = normalize_content(*content, i);
    out.push_back(std::move(copy));
  }
  return out;
}

std::vector<std::string> parse_stop(const Json* stop, const ApiLimits& limits) {
  std::vector<std::string> out;
  if (stop == nullptr) return out;
  auto add = [&](const Json& s) {
    if (!s.is_string()) reject("stop", "'stop' must be a string or a list of strings.");
    const auto& text = s.get_ref<const std::string&>();
    if (text.empty()) reject("stop", "'stop' strings must not be empty.");
    if (static_cast<int>(text.size()) > limits.max_stop_bytes)
      reject("stop", "'stop' strings must be at most " + std::to_string(limits.max_stop_bytes) + " bytes.");
    out.push_back(text);
  };
  if (stop->is_array()) {
    if (static_cast<int>(stop->size()) > limits.max_stop)
      reject("stop", "at most " + std::to_string(limits.max_stop) + " stop strings, got " + std::to_string(stop->size()) + ".");
    for (const Json& s : *stop) add(s);
  } else {
    add(*stop);
  }
  return out;
}

std::vector<int32_t> id_list(const Json* v, const std::string& param, size_t max_size) {
  std::vector<int32_t> ids;
  if (v == nullptr) return ids;
  if (!v->is_array()) reject(param, "'" + param + "' must be a list of token ids.");
  if (v->size() > max_size) reject(param, "'" + param + "' holds at most " + std::to_string(max_size) + " token ids.");
  for (const Json& id : *v)
    ids.push_back(static_cast<int32_t>(Fields::as_integer(id, param, 0, std::numeric_limits<int32_t>::max())));
  return ids;
}

// {"50256": -100, ...}: token ids as decimal strings (JSON keys are strings), biases in
// [-100, 100] added to the logits. The ids are checked against the vocabulary by the front end.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const Json* v, const ApiLimits& limits) {
  std::vector<std::pair<int32_t, float>> out;
  if (v == nullptr) return out;
  if (!v->is_object())
    reject("logit_bias", "'logit_bias' must be an object mapping token ids to biases, e.g. {\"50256\": -100}.");
  if (static_cast<int>(v->size()) > limits.max_logit_bias)
    reject("logit_bias", "'logit_bias' holds at most " + std::to_string(limits.max_logit_bias) + " entries, got " +
                             std::to_string(v->size()) + ".");
  std::map<int32_t, float> bias;  // "7" and "07" name one token: the later entry wins, as in a Python dict
  for (const auto& [key, value] : v->items()) {
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoll(key) > std::numeric_limits<int32_t>::max())
      reject("logit_bias", "'logit_bias' keys must be token ids written as decimal integers, got '" + key + "'.");
    if (!value.is_number())
      reject("logit_bias", "'logit_bias' values must be numbers in [-100, 100], got " + type_name(value) + " for token " + key + ".");
    const double b = value.get<double>();
    if (!(b >= -100.0 && b <= 100.0))
      reject("logit_bias", "'logit_bias' values must be in [-100, 100], got " + value.dump() + " for token " + key + ".");
    bias[static_cast<int32_t>(std::stoll(key))] = static_cast<float>(b);
  }
  out.assign(bias.begin(), bias.end());
  return out;
}

void parse_stream_options(const Fields& f, ApiRequest& r) {
  const Json* options = f.find("stream_options");
  if (options == nullptr) return;
  if (!options->is_object()) reject("stream_options", "'stream_options' must be an object.");
  if (!r.stream) reject("stream_options", "'stream_options' is only allowed when 'stream' is true.");
  for (const auto& [key, value] : options->items())
    if (key != "include_usage" && key != "include_obfuscation" && key != "continuous_usage_stats")
      reject("stream_options", "Unknown parameter: 'stream_options." + key + "'.", "unknown_parameter");
  const Fields o(*options);
  r.include_usage = o.boolean("include_usage").value_or(false);
  (void)o.boolean("include_obfuscation");  // no obfuscation padding is ever sent: nothing to turn off
  if (o.boolean("continuous_usage_stats").value_or(false))
    reject("stream_options", "'stream_options.continuous_usage_stats' is not supported by this server: usage comes in "
                             "the last chunk (include_usage).", "unsupported_parameter");
}

void parse_chat_fields(const Fields& f, ApiRequest& r) {
  r.messages = parse_messages(f.find("messages"));
  if (const Json* kwargs = f.find("chat_template_kwargs")) {
    if (!kwargs->is_object()) reject("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
    r.template_kwargs = *kwargs;
  }
  if (const Json* documents = f.find("documents")) {
    if (!documents->is_array()) reject("documents", "'documents' must be a list of objects.");
    for (const Json& d : *documents)
      if (!d.is_object()) reject("documents", "'documents' must be a list of objects, e.g. {\"title\": ..., \"text\": ...}.");
    r.documents = *documents;
  }
  r.continue_final_message = f.boolean("continue_final_message").value_or(false);
  const std::optional<bool> generation_prompt = f.boolean("add_generation_prompt");
  if (r.continue_final_message && generation_prompt.value_or(false))
    reject("continue_final_message", "'continue_final_message' and 'add_generation_prompt' cannot both be true.");
  r.add_generation_prompt = generation_prompt.value_or(!r.continue_final_message);
  if (r.continue_final_message && !r.messages.back().contains("content"))
    reject("continue_final_message", "'continue_final_message' needs a last message with text content.");
  // tools / tool_choice have their shape checked by check_request_fields; the rest (names,
  // parameters, the named function) is tool_calls.cpp's.
  if (const Json* tools = f.find("tools")) r.tools = *tools;
  if (const Json* choice = f.find("tool_choice")) r.tool_choice = *choice;
  r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
}

ApiRequest parse_fields(const Json& body, ApiKind kind, const ApiLimits& limits) {
  if (!body.is_object()) reject("", "the request body must be a JSON object.");
  check_request_fields(body, kind, limits.ignored_fields);
  const Fields f(body);
  ApiRequest r;
  r.kind = kind;
  r.model = f.string("model").value_or("");

  if (kind == ApiKind::completion) {
    r.prompts = parse_prompts(f.find("prompt"), limits);
    r.echo = f.boolean("echo").value_or(false);
  } else {
    parse_chat_fields(f, r);
  }
  r.add_special_tokens = f.boolean("add_special_tokens");
  if (auto v = f.integer("truncate_prompt_tokens", 1, 1 << 24)) r.truncate_prompt_tokens = static_cast<int>(*v);

  // max_completion_tokens is the newer chat name; it wins when both are given.
  constexpr int64_t kMaxTokens = 1 << 24;
  // max_tokens 0 with echo scores the prompt and generates nothing (OpenAI's legacy API and
  // vLLM allow it; evaluation harnesses use it).
  if (auto v = f.integer("max_tokens", r.echo ? 0 : 1, kMaxTokens)) r.max_tokens = static_cast<int>(*v);
  if (kind == ApiKind::chat)
    if (auto v = f.integer("max_completion_tokens", 1, kMaxTokens)) r.max_tokens = static_cast<int>(*v);

  SamplingParams& s = r.sampling;
  s.temperature = static_cast<float>(f.number("temperature", 0.0, 2.0).value_or(1.0));
  s.top_p = static_cast<float>(f.number("top_p", 0.0, 1.0, /*lo_open=*/true).value_or(1.0));
  // -1 and 0 both mean "no top-k" (vLLM uses -1, our sampler 0).
  s.top_k = static_cast<int>(std::max<int64_t>(0, f.integer("top_k", -1, 1 << 24).value_or(0)));
  s.min_p = static_cast<float>(f.number("min_p", 0.0, 1.0).value_or(0.0));
  s.presence_penalty = static_cast<float>(f.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  s.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 0.0, 2.0, /*lo_open=*/true).value_or(1.0));
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = static_cast<uint64_t>(*seed);
  s.logit_bias = parse_logit_bias(f.find("logit_bias"), limits);
  if (const Json* allowed = f.find("allowed_token_ids")) {
    if (allowed->is_array() && allowed->empty())
      reject("allowed_token_ids", "'allowed_token_ids' must not be empty (it would leave nothing to sample).");
    s.allowed_token_ids = id_list(allowed, "allowed_token_ids", 1u << 20);
  }

  if (kind == ApiKind::completion) {
    if (auto v = f.integer("logprobs", 0, limits.max_logprobs)) s.num_logprobs = static_cast<int>(*v);
  } else {
    const bool want = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, limits.max_logprobs);
    if (top && *top > 0 && !want) reject("top_logprobs", "'top_logprobs' needs 'logprobs': true.");
    if (want) s.num_logprobs = static_cast<int>(top.value_or(0));
  }
  if (auto v = f.integer("prompt_logprobs", 0, limits.max_logprobs)) r.prompt_logprobs = static_cast<int>(*v);
  s.min_tokens = static_cast<int>(f.integer("min_tokens", 0, kMaxTokens).value_or(0));
  if (r.max_tokens && s.min_tokens > *r.max_tokens)
    reject("min_tokens", "'min_tokens' (" + std::to_string(s.min_tokens) + ") must not exceed 'max_tokens' (" +
                             std::to_string(*r.max_tokens) + ").");
  r.return_tokens_as_token_ids = f.boolean("return_tokens_as_token_ids").value_or(false);

  r.stop = parse_stop(f.find("stop"), limits);
  r.stop_token_ids = id_list(f.find("stop_token_ids"), "stop_token_ids", static_cast<size_t>(limits.max_stop));
  r.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  r.n = static_cast<int>(f.integer("n", 1, limits.max_n).value_or(1));
  r.stream = f.boolean("stream").value_or(false);
  r.best_of = static_cast<int>(f.integer("best_of", 1, limits.max_n).value_or(r.n));
  if (r.best_of < r.n)
    reject("best_of", "'best_of' must be at least 'n' (" + std::to_string(r.n) + "), got " + std::to_string(r.best_of) + ".");
  if (r.stream && r.best_of > r.n)
    reject("best_of", "'best_of' greater than 'n' cannot be streamed: which choices are best is known only when all "
                      "are done.");
  parse_stream_options(f, r);
  if (r.stream && r.prompt_logprobs)
    reject("prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true (as in vLLM); echo with logprobs "
                              "streams the prompt's logprobs in the first chunk.");
  if (const Json* format = f.find("response_format")) r.response_format = *format;
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  r.priority = static_cast<int>(f.integer("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()).value_or(0));
  return r;
}

}  // namespace

std::variant<nlohmann::ordered_json, ApiError> parse_json_body(std::string_view body, int max_depth) {
  // The callback bounds the nesting depth while parsing, before a deep document is built.
  auto limit_depth = [max_depth](int depth, Json::parse_event_t, Json&) {
    if (depth > max_depth) throw TooDeep{};
    return true;
  };
  try {
    return Json::parse(body.begin(), body.end(), limit_depth);
  } catch (const TooDeep&) {
    return bad_request("JSON nesting deeper than " + std::to_string(max_depth) + " levels.");
  } catch (const Json::exception& e) {
    return bad_request(std::string("The request body is not valid JSON: ") + e.what());
  }
}

std::variant<ApiRequest, ApiError> parse_api_request(std::string_view body, ApiKind kind, const ApiLimits& limits) {
  auto doc = parse_json_body(body, limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&doc)) return *error;
  try {
    return parse_fields(std::get<Json>(doc), kind, limits);
  } catch (const api_detail::Rejected& r) {
    return r.error;
  } catch (const Json::exception& e) {
    // A type mismatch a check above did not foresee: still the client's input, still a 400.
    return bad_request(std::string("Invalid request: ") + e.what());
  }
}

}  // namespace fp8serve
