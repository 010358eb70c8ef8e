#include "server/api/responses_request.hpp"

#include "server/api/request_features.hpp"
#include "server/api/request_fields.hpp"

namespace fp8serve {

namespace {

using namespace api_detail;

constexpr size_t kMaxInputItems = 4096;
constexpr const char* kLogprobsInclude = "message.output_text.logprobs";

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  reject(param, "'" + param + "' is not supported by this server: " + what + ".", "unsupported_parameter");
}

const Json* present(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

std::string required_string(const Json& object, const char* key, const std::string& param) {
  const Json* v = present(object, key);
  if (v == nullptr || !v->is_string()) reject(param + "." + key, "'" + param + "." + key + "' must be a string.");
  return v->get<std::string>();
}

// Message content: a string, or input_text / output_text parts. -> normalized parts.
Json content_parts(const Json& content, const std::string& role, const std::string& param) {
  const char* own_type = role == "assistant" ? "output_text" : "input_text";
  if (content.is_string()) return Json::array({{{"type", own_type}, {"text", content}}});
  if (!content.is_array()) reject(param, "'" + param + "' must be a string or a list of content parts.");
  Json parts = Json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string p = param + "[" + std::to_string(j) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      reject(p, "'" + p + "' must be a content part with a 'type'.");
    const std::string type = part["type"].get<std::string>();
    if (type == "input_text" || type == "output_text") {
      parts.push_back({{"type", type}, {"text", required_string(part, "text", p)}});
    } else if (type == "refusal") {
      parts.push_back({{"type", "output_text"}, {"text", required_string(part, "refusal", p)}});
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      unsupported(p, "this server takes text only ('" + type + "')");
    } else {
      reject(p + ".type", "'" + p + ".type' must be input_text or output_text, got '" + type + "'.");
    }
  }
  return parts;
}

// One input item -> its normalized form with an id.
Json normalize_item(const Json& item, size_t i, const std::string& id_seed) {
  const std::string param = "input[" + std::to_string(i) + "]";
  if (!item.is_object()) reject(param, "'" + param + "' must be an item object.");
  const Json* type = present(item, "type");
  if (type != nullptr && !type->is_string()) reject(param + ".type", "'" + param + ".type' must be a string.");
  const std::string kind = type != nullptr ? type->get<std::string>() : item.contains("role") ? "message" : "";
  const std::string given_id = present(item, "id") && item["id"].is_string() ? item["id"].get<std::string>() : "";
  auto id = [&](const char* prefix) { return given_id.empty() ? prefix + id_seed + "_" + std::to_string(i) : given_id; };
  if (kind == "message") {
    const std::string role = required_string(item, "role", param);
    if (role != "system" && role != "developer" && role != "user" && role != "assistant")
      reject(param + ".role", "'" + param + ".role' must be system, developer, user or assistant, got '" + role + "'.");
    const Json* content = present(item, "content");
    if (content == nullptr) reject(param + ".content", "'" + param + ".content' is required.");
    return {{"type", "message"}, {"id", id("msg_")}, {"role", role}, {"content", content_parts(*content, role, param + ".content")}};
  }
  if (kind == "function_call") {
    return {{"type", "function_call"}, {"id", id("fc_")}, {"call_id", required_string(item, "call_id", param)},
            {"name", required_string(item, "name", param)}, {"arguments", required_string(item, "arguments", param)},
            {"status", "completed"}};
  }
  if (kind == "function_call_output") {
    const Json* output = present(item, "output");
    std::string text;
    if (output != nullptr && output->is_string()) {
      text = output->get<std::string>();
    } else if (output != nullptr && output->is_array()) {
      for (const Json& part : content_parts(*output, "tool", param + ".output")) text += part["text"].get<std::string>();
    } else {
      reject(param + ".output", "'" + param + ".output' must be a string or a list of input_text parts.");
    }
    return {{"type", "function_call_output"}, {"id", id("fco_")}, {"call_id", required_string(item, "call_id", param)},
            {"output", text}, {"status", "completed"}};
  }
  if (kind.empty()) reject(param, "'" + param + "' needs a 'type' (or a 'role', for a message).");
  if (kind == "reasoning" || kind == "item_reference" || kind.find("_call") != std::string::npos)
    unsupported(param + ".type", "items of type '" + kind + "' (this server has messages, function_call and function_call_output)");
  reject(param + ".type", "'" + param + ".type' must be message, function_call or function_call_output, got '" + kind + "'.");
}

Json parse_input(const Json* input, const std::string& id_seed) {
  if (input == nullptr) reject("input", "'input' is required.");
  if (input->is_string()) {
    if (input->get_ref<const std::string&>().empty()) reject("input", "'input' must not be empty.");
    return Json::array({normalize_item({{"role", "user"}, {"content", *input}}, 0, id_seed)});
  }
  if (!input->is_array()) reject("input", "'input' must be a string or a list of items, got " + type_name(*input) + ".");
  if (input->empty()) reject("input", "'input' must not be empty.");
  if (input->size() > kMaxInputItems)
    reject("input", "'input' holds at most " + std::to_string(kMaxInputItems) + " items, got " + std::to_string(input->size()) + ".");
  Json items = Json::array();
  for (size_t i = 0; i < input->size(); ++i) items.push_back(normalize_item((*input)[i], i, id_seed));
  return items;
}

// Responses' flat function tools -> chat's {"type": "function", "function": {...}}.
Json chat_tools(const Json& tools) {
  if (!tools.is_array()) reject("tools", "'tools' must be a list, got " + type_name(tools) + ".");
  Json out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    const std::string param = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object() || !tool.contains("type") || !tool["type"].is_string())
      reject(param, "'" + param + "' must be a tool object with a 'type'.");
    const std::string type = tool["type"].get<std::string>();
    if (type != "function") unsupported(param, "built-in tools ('" + type + "'); only function tools are served");
    Json function = {{"name", required_string(tool, "name", param)}};
    for (const char* key : {"description", "parameters", "strict"})
      if (const Json* v = present(tool, key)) function[key] = *v;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

Json chat_tool_choice(const Json& choice) {
  if (choice.is_string()) return choice;  // none / auto / required: chat checks the word
  if (!choice.is_object() || !choice.contains("type") || !choice["type"].is_string())
    reject("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}.");
  const std::string type = choice["type"].get<std::string>();
  if (type != "function") unsupported("tool_choice", "a tool choice of type '" + type + "'");
  return {{"type", "function"}, {"function", {{"name", required_string(choice, "name", "tool_choice")}}}};
}

// text: {"format": {...}} -> chat's response_format (null for plain text).
Json chat_response_format(const Json& text) {
  if (!text.is_object()) reject("text", "'text' must be an object, e.g. {\"format\": {\"type\": \"json_object\"}}.");
  for (const auto& [key, value] : text.items()) {
    if (key == "verbosity" && !value.is_null()) unsupported("text.verbosity", "no verbosity control");
    if (key != "verbosity" && key != "format") reject("text." + key, "Unknown parameter: 'text." + key + "'.", "unknown_parameter");
  }
  const Json* format = present(text, "format");
  if (format == nullptr) return nullptr;
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
    reject("text.format.type", "'text.format.type' must be text, json_object or json_schema.");
  const std::string type = (*format)["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return {{"type", "json_object"}};
  if (type != "json_schema")
    reject("text.format.type", "'text.format.type' must be text, json_object or json_schema, got '" + type + "'.");
  Json schema = {{"name", required_string(*format, "name", "text.format")}};
  const Json* body = present(*format, "schema");
  if (body == nullptr) reject("text.format.schema", "'text.format.schema' is required for json_schema.");
  schema["schema"] = *body;
  for (const char* key : {"description", "strict"})
    if (const Json* v = present(*format, key)) schema[key] = *v;
  return {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

void check_metadata(const Json& metadata) {
  if (!metadata.is_object()) reject("metadata", "'metadata' must be an object of strings.");
  if (metadata.size() > 16) reject("metadata", "'metadata' holds at most 16 pairs.");
  for (const auto& [key, value] : metadata.items())
    if (key.size() > 64 || !value.is_string() || value.get_ref<const std::string&>().size() > 512)
      reject("metadata", "'metadata' keys must be at most 64 characters and values strings of at most 512.");
}

ResponsesRequest parse_fields(const Json& body, const ApiLimits& limits, const std::string& id_seed) {
  if (!body.is_object()) reject("", "the request body must be a JSON object.");
  check_responses_fields(body, limits.ignored_fields);
  ResponsesRequest r;
  Fields f(body);
  r.input_items = parse_input(present(body, "input"), id_seed);
  r.instructions = f.string("instructions");
  r.previous_response_id = f.string("previous_response_id");
  r.store = f.boolean("store").value_or(true);
  r.stream = f.boolean("stream").value_or(false);
  if (const auto truncation = f.string("truncation"); truncation && *truncation != "disabled") {
    if (*truncation == "auto") unsupported("truncation", "'auto' (dropping old items); an input must fit the context");
    reject("truncation", "'truncation' must be disabled or auto, got '" + *truncation + "'.");
  }
  if (const Json* metadata = present(body, "metadata")) check_metadata(*metadata);

  Json& chat = r.chat;
  chat = Json::object();
  for (const char* key : {"model", "temperature", "top_p", "seed", "top_k", "min_p", "repetition_penalty", "priority",
                          "parallel_tool_calls", "stream"})
    if (const Json* v = present(body, key)) chat[key] = *v;
  if (const Json* v = present(body, "max_output_tokens")) chat["max_completion_tokens"] = *v;
  if (const Json* v = present(body, "tools")) chat["tools"] = chat_tools(*v);
  if (const Json* v = present(body, "tool_choice")) chat["tool_choice"] = chat_tool_choice(*v);
  const Json* text = present(body, "text");
  if (text != nullptr) chat["response_format"] = chat_response_format(*text);
  bool logprobs = false;
  if (const Json* include = present(body, "include")) {
    if (!include->is_array()) reject("include", "'include' must be a list.");
    for (const Json& value : *include) {
      if (!value.is_string()) reject("include", "'include' must be a list of strings.");
      if (value != kLogprobsInclude)
        unsupported("include", "only \"" + std::string(kLogprobsInclude) + "\" can be included, not '" + value.get<std::string>() + "'");
      logprobs = true;
    }
  }
  if (const Json* v = present(body, "top_logprobs")) {
    chat["top_logprobs"] = *v;
    logprobs = true;
  }
  if (logprobs) chat["logprobs"] = true;

  auto given = [&](const char* key, Json fallback) {
    const Json* v = present(body, key);
    return v != nullptr ? *v : std::move(fallback);
  };
  Json& echo = r.echo;
  echo["background"] = false;
  echo["instructions"] = given("instructions", nullptr);
  echo["max_output_tokens"] = given("max_output_tokens", nullptr);
  echo["max_tool_calls"] = nullptr;
  echo["parallel_tool_calls"] = given("parallel_tool_calls", true);
  echo["previous_response_id"] = given("previous_response_id", nullptr);
  echo["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  echo["service_tier"] = "default";
  echo["store"] = r.store;
  echo["temperature"] = given("temperature", 1.0);
  Json text_echo = {{"format", {{"type", "text"}}}};
  if (text != nullptr && present(*text, "format")) text_echo["format"] = (*text)["format"];
  echo["text"] = std::move(text_echo);
  echo["tool_choice"] = given("tool_choice", "auto");
  echo["tools"] = given("tools", Json::array());
  echo["top_logprobs"] = given("top_logprobs", 0);
  echo["top_p"] = given("top_p", 1.0);
  echo["truncation"] = "disabled";
  echo["user"] = given("user", nullptr);
  echo["metadata"] = given("metadata", Json::object());
  return r;
}

}  // namespace

std::variant<ResponsesRequest, ApiError> parse_responses_request(std::string_view body, const ApiLimits& limits,
                                                                 const std::string& id_seed) {
  auto doc = parse_json_body(body, limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&doc)) return *error;
  try {
    return parse_fields(std::get<Json>(doc), limits, id_seed);
  } catch (const Rejected& r) {
    return r.error;
  } catch (const Json::exception& e) {
    return bad_request(std::string("Invalid request: ") + e.what());
  }
}

Json items_to_messages(const Json& items, const std::optional<std::string>& instructions) {
  Json messages = Json::array();
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  bool calls_open = false;  // the last message is an assistant message that function calls may join
  for (const Json& item : items) {
    const std::string type = item["type"].get<std::string>();
    if (type == "message") {
      std::string text;
      for (const Json& part : item["content"]) {
        if (!text.empty()) text += '\n';
        text += part["text"].get<std::string>();
      }
      const std::string role = item["role"].get<std::string>();
      messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      calls_open = role == "assistant";
    } else if (type == "function_call") {
      if (!calls_open) messages.push_back({{"role", "assistant"}, {"content", nullptr}});
      Json& message = messages.back();
      if (!message.contains("tool_calls")) message["tool_calls"] = Json::array();
      message["tool_calls"].push_back({{"id", item["call_id"]},
                                       {"type", "function"},
                                       {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
      calls_open = true;
    } else {  // function_call_output
      messages.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", item["output"]}});
      calls_open = false;
    }
  }
  return messages;
}

ApiError responses_error(ApiError e) {
  static const std::pair<std::string, std::string> kNames[] = {
      {"max_completion_tokens", "max_output_tokens"}, {"response_format", "text.format"}, {"messages", "input"}};
  for (const auto& [chat, responses] : kNames) {
    if (e.param.rfind(chat, 0) == 0) e.param = responses + e.param.substr(chat.size());
    for (size_t at = e.message.find("'" + chat); at != std::string::npos; at = e.message.find("'" + chat, at + 1))
      e.message.replace(at + 1, chat.size(), responses);
  }
  return e;
}

}  // namespace fp8serve
