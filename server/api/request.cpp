#include "server/api/request.hpp"

#include <cmath>
#include <limits>

namespace fp8serve {

namespace {

using Json = nlohmann::ordered_json;

// Thrown inside this file only and turned into a value at the parse boundary.
struct Rejected {
  ApiError error;
};

[[noreturn]] void reject(const std::string& param, const std::string& message) {
  throw Rejected{bad_request(message, param)};
}

struct TooDeep {};

std::string type_name(const Json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Reads optional fields of one JSON object; a field that is absent or null counts as absent,
// as the OpenAI API treats them.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const Json* find(const char* key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) reject(key, std::string("'") + key + "' must be a number, got " + type_name(*v) + ".");
    const double x = v->get<double>();
    const bool below = lo_open ? !(x > lo) : !(x >= lo);
    if (below || !(x <= hi) || !std::isfinite(x)) {
      std::string range = std::string(lo_open ? "(" : "[") + format(lo) + ", " + format(hi) + "]";
      reject(key, std::string("'") + key + "' must be in " + range + ", got " + v->dump() + ".");
    }
    return x;
  }

  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    return as_integer(*v, key, lo, hi);
  }

  std::optional<bool> boolean(const char* key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) reject(key, std::string("'") + key + "' must be a boolean, got " + type_name(*v) + ".");
    return v->get<bool>();
  }

  std::optional<std::string> string(const char* key) const {
    const Json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) reject(key, std::string("'") + key + "' must be a string, got " + type_name(*v) + ".");
    return v->get<std::string>();
  }

  static int64_t as_integer(const Json& v, const std::string& param, int64_t lo, int64_t hi) {
    // 5.0 is accepted as 5 (JSON has one number type); 5.5 is not.
    int64_t x = 0;
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        reject(param, "'" + param + "' must be at most " + std::to_string(hi) + ", got " + v.dump() + ".");
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9e18) {
      x = static_cast<int64_t>(v.get<double>());
    } else {
      reject(param, "'" + param + "' must be an integer, got " + type_name(v) + ".");
    }
    if (x < lo || x > hi)
      reject(param, "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                        std::to_string(x) + ".");
    return x;
  }

 private:
  static std::string format(double x) {
    if (std::trunc(x) == x && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
    return Json(x).dump();
  }
  const Json& object_;
};

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

ApiRequest parse_fields(const Json& body, ApiKind kind, const ApiLimits& limits) {
  if (!body.is_object()) reject("", "the request body must be a JSON object.");
  const Fields f(body);
  ApiRequest r;
  r.kind = kind;
  r.model = f.string("model").value_or("");

  if (kind == ApiKind::completion) {
    r.prompts = parse_prompts(f.find("prompt"), limits);
    r.echo = f.boolean("echo").value_or(false);
    if (auto suffix = f.string("suffix"); suffix && !suffix->empty())
      reject("suffix", "'suffix' is not supported by this server.");
  } else {
    r.messages = parse_messages(f.find("messages"));
    if (const Json* tools = f.find("tools")) {
      if (!tools->is_array()) reject("tools", "'tools' must be a list.");
      r.tools = *tools;
    }
    if (const Json* choice = f.find("tool_choice")) r.tool_choice = *choice;
    r.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);
    if (const Json* kwargs = f.find("chat_template_kwargs")) {
      if (!kwargs->is_object()) reject("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
      r.template_kwargs = *kwargs;
    }
    r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  }

  // max_completion_tokens is the newer chat name; it wins when both are given.
  constexpr int64_t kMaxTokens = 1 << 24;
  if (auto v = f.integer("max_tokens", 1, kMaxTokens)) r.max_tokens = static_cast<int>(*v);
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

  if (kind == ApiKind::completion) {
    if (auto v = f.integer("logprobs", 0, limits.max_logprobs)) s.num_logprobs = static_cast<int>(*v);
  } else {
    const bool want = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, limits.max_logprobs);
    if (top && *top > 0 && !want) reject("top_logprobs", "'top_logprobs' needs 'logprobs': true.");
    if (want) s.num_logprobs = static_cast<int>(top.value_or(0));
  }
  if (r.echo && s.num_logprobs >= 0)
    reject("echo", "'echo' together with 'logprobs' (prompt logprobs) is not supported by this server.");

  r.stop = parse_stop(f.find("stop"), limits);
  if (const Json* ids = f.find("stop_token_ids")) {
    if (!ids->is_array()) reject("stop_token_ids", "'stop_token_ids' must be a list of token ids.");
    if (static_cast<int>(ids->size()) > limits.max_stop) reject("stop_token_ids", "too many 'stop_token_ids'.");
    for (const Json& id : *ids)
      r.stop_token_ids.push_back(static_cast<int32_t>(Fields::as_integer(id, "stop_token_ids", 0, std::numeric_limits<int32_t>::max())));
  }
  r.n = static_cast<int>(f.integer("n", 1, limits.max_n).value_or(1));
  r.stream = f.boolean("stream").value_or(false);
  if (const Json* options = f.find("stream_options")) {
    if (!options->is_object()) reject("stream_options", "'stream_options' must be an object.");
    if (!r.stream) reject("stream_options", "'stream_options' is only allowed when 'stream' is true.");
    r.include_usage = Fields(*options).boolean("include_usage").value_or(false);
  }
  if (const Json* format = f.find("response_format")) r.response_format = *format;
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  (void)f.string("user");  // accepted and type-checked; not used
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
  } catch (const Rejected& r) {
    return r.error;
  } catch (const Json::exception& e) {
    // A type mismatch a check above did not foresee: still the client's input, still a 400.
    return bad_request(std::string("Invalid request: ") + e.what());
  }
}

}  // namespace fp8serve
