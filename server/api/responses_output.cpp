#include "server/api/responses_output.hpp"

namespace fp8serve {

using Json = nlohmann::ordered_json;

namespace {

// fc_<the call id's hex>: the item id of a function call (its call_id is the parser's call_...).
std::string call_item_id(const std::string& call_id) {
  return "fc_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

Json call_item(const std::string& call_id, const std::string& name, const std::string& arguments, const char* status) {
  return {{"type", "function_call"}, {"id", call_item_id(call_id)}, {"call_id", call_id},
          {"name", name},            {"arguments", arguments},      {"status", status}};
}

}  // namespace

ResponsesBuilder::ResponsesBuilder(ResponsesMeta meta, ResponseMeta chat, TokenBytesFn token_bytes)
    : meta_(std::move(meta)), chat_(std::move(chat)), token_bytes_(std::move(token_bytes)) {
  if (!chat_.prompt_tokens.empty()) usage_.prompt_tokens = chat_.prompt_tokens.front();
  if (chat_.stream && chat_.tool_parser)
    tools_ = std::make_unique<ToolCallStream>(*chat_.tool_parser, chat_.id + ":0", chat_.max_tool_calls);
}

std::string ResponsesBuilder::message_id(int ordinal) const {
  const std::string base = "msg_" + meta_.id.substr(meta_.id.find('_') + 1);
  return ordinal == 0 ? base : base + "_" + std::to_string(ordinal);
}

std::string ResponsesBuilder::status() const {
  if (!finish_) return "in_progress";
  switch (*finish_) {
    case FinishReason::stop: return "completed";
    case FinishReason::length: return "incomplete";
    case FinishReason::abort: return "cancelled";
    case FinishReason::error: return "failed";
  }
  return "completed";
}

std::string ResponsesBuilder::summary_finish() const { return finish_ ? finish_reason_name(*finish_) : "abort"; }

Json ResponsesBuilder::message_item(const std::string& id, const std::string& text, const Json& logprobs,
                                    const char* item_status) const {
  return {{"type", "message"},
          {"id", id},
          {"status", item_status},
          {"role", "assistant"},
          {"content", Json::array({{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}, {"logprobs", logprobs}}})}};
}

Json ResponsesBuilder::response(const std::string& response_status, Json output) const {
  Json r;
  r["id"] = meta_.id;
  r["object"] = "response";
  r["created_at"] = meta_.created_at;
  r["status"] = response_status;
  r["error"] = nullptr;
  if (response_status == "failed")
    r["error"] = {{"code", "server_error"}, {"message", engine_error_.value_or("engine error")}};
  r["incomplete_details"] = nullptr;
  if (response_status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["model"] = chat_.model;
  r["output"] = std::move(output);
  for (const auto& [key, value] : meta_.echo.items()) r[key] = value;
  r["usage"] = nullptr;
  if (finish_)
    r["usage"] = {{"input_tokens", usage_.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", usage_.cached_tokens}}},
                  {"output_tokens", usage_.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
  return r;
}

Json ResponsesBuilder::output_items() const {
  const char* item_status = status() == "incomplete" ? "incomplete" : "completed";
  Json output = Json::array();
  if (!chat_.tool_parser) {
    output.push_back(message_item(message_id(0), text_, logprobs_, item_status));
    return output;
  }
  ToolCallStream parser(*chat_.tool_parser, chat_.id + ":0", chat_.max_tool_calls);
  parser.push(text_);
  parser.finish();
  const Json calls = parser.tool_calls();
  if (!parser.content().empty() || calls.empty()) output.push_back(message_item(message_id(0), parser.content(), logprobs_, item_status));
  for (const Json& call : calls)
    output.push_back(call_item(call["id"].get<std::string>(), call["function"]["name"].get<std::string>(),
                               call["function"]["arguments"].get<std::string>(), "completed"));
  return output;
}

std::string ResponsesBuilder::event(Json body) {
  body["sequence_number"] = sequence_++;
  const std::string type = body["type"].get<std::string>();
  return "event: " + type + "\ndata: " + dump_json(body) + "\n\n";
}

std::vector<std::string> ResponsesBuilder::stream_head() {
  std::vector<std::string> events;
  const Json created = response("in_progress", Json::array());
  events.push_back(event({{"type", "response.created"}, {"response", created}}));
  events.push_back(event({{"type", "response.in_progress"}, {"response", created}}));
  return events;
}

void ResponsesBuilder::open_message(std::vector<std::string>& events) {
  StreamItem item;
  item.item = {{"type", "message"}, {"id", message_id(messages_++)}, {"status", "in_progress"}, {"role", "assistant"},
               {"content", Json::array()}};
  open_message_ = static_cast<int>(items_.size());
  items_.push_back(item);
  events.push_back(event({{"type", "response.output_item.added"}, {"output_index", open_message_}, {"item", item.item}}));
  events.push_back(event({{"type", "response.content_part.added"},
                          {"item_id", item.item["id"]},
                          {"output_index", open_message_},
                          {"content_index", 0},
                          {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}, {"logprobs", Json::array()}}}}));
}

void ResponsesBuilder::stream_text(const std::string& text, const Json& logprobs, std::vector<std::string>& events) {
  if (text.empty() && logprobs.empty()) return;
  if (open_message_ < 0) open_message(events);
  StreamItem& item = items_[static_cast<size_t>(open_message_)];
  item.text += text;
  for (const Json& lp : logprobs) item.logprobs.push_back(lp);
  events.push_back(event({{"type", "response.output_text.delta"},
                          {"item_id", item.item["id"]},
                          {"output_index", open_message_},
                          {"content_index", 0},
                          {"delta", text},
                          {"logprobs", logprobs}}));
}

void ResponsesBuilder::stream_calls(const Json& deltas, std::vector<std::string>& events) {
  for (const Json& delta : deltas) {
    const size_t k = delta["index"].get<size_t>();
    if (delta.contains("id")) {  // a new call: the message before it is complete
      close_items(events);
      StreamItem item;
      item.item = call_item(delta["id"].get<std::string>(), delta["function"]["name"].get<std::string>(), "", "in_progress");
      if (call_items_.size() <= k) call_items_.resize(k + 1, -1);
      call_items_[k] = static_cast<int>(items_.size());
      items_.push_back(item);
      events.push_back(event({{"type", "response.output_item.added"}, {"output_index", call_items_[k]}, {"item", item.item}}));
    }
    const std::string arguments = delta["function"].value("arguments", "");
    if (arguments.empty() || k >= call_items_.size() || call_items_[k] < 0) continue;
    StreamItem& item = items_[static_cast<size_t>(call_items_[k])];
    item.text += arguments;
    events.push_back(event({{"type", "response.function_call_arguments.delta"},
                            {"item_id", item.item["id"]},
                            {"output_index", call_items_[k]},
                            {"delta", arguments}}));
  }
}

void ResponsesBuilder::close_items(std::vector<std::string>& events) {
  const char* item_status = finish_ && *finish_ == FinishReason::length ? "incomplete" : "completed";
  for (size_t i = 0; i < items_.size(); ++i) {
    StreamItem& item = items_[i];
    if (!item.open) continue;
    item.open = false;
    const int index = static_cast<int>(i);
    const Json id = item.item["id"];  // a copy: item.item is replaced below
    if (item.item["type"] == "message") {
      events.push_back(event({{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", index},
                              {"content_index", 0}, {"text", item.text}, {"logprobs", item.logprobs}}));
      events.push_back(event({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", index},
                              {"content_index", 0},
                              {"part", {{"type", "output_text"}, {"text", item.text}, {"annotations", Json::array()},
                                        {"logprobs", item.logprobs}}}}));
      item.item = message_item(id.get<std::string>(), item.text, item.logprobs, item_status);
      open_message_ = -1;
    } else {
      item.item["arguments"] = item.text;
      item.item["status"] = "completed";
      events.push_back(event({{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index},
                              {"name", item.item["name"]}, {"arguments", item.text}}));
    }
    events.push_back(event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item.item}}));
  }
}

std::vector<std::string> ResponsesBuilder::on_output(int prompt_index, const RequestOutput& output) {
  std::vector<std::string> events;
  if (prompt_index != 0 || output.index != 0 || finish_) return events;
  usage_.prompt_tokens = std::max(usage_.prompt_tokens, output.prompt_tokens);
  usage_.cached_tokens = std::max(usage_.cached_tokens, output.cached_tokens);
  usage_.completion_tokens = std::max(usage_.completion_tokens, output.completion_tokens);
  Json logprobs = Json::array();
  if (chat_.num_logprobs >= 0) logprobs = token_logprob_items(output.logprobs, token_bytes_, chat_.tokens_as_ids);
  for (const Json& lp : logprobs) logprobs_.push_back(lp);
  text_ += output.text_delta;
  if (output.finish) {
    finish_ = output.finish;
    if (*finish_ == FinishReason::error) engine_error_ = output.error.empty() ? "engine error" : output.error;
  }
  if (!chat_.stream || (finish_ && (*finish_ == FinishReason::error || *finish_ == FinishReason::abort))) return events;
  if (tools_) {
    ToolCallDelta d = tools_->push(output.text_delta);
    if (finish_) d.append(tools_->finish());
    stream_text(d.content, Json::array(), events);
    stream_calls(d.tool_calls, events);
  } else {
    stream_text(output.text_delta, logprobs, events);
  }
  if (finish_) {
    if (items_.empty()) open_message(events);  // an empty answer: still its message
    close_items(events);
  }
  return events;
}

std::vector<std::string> ResponsesBuilder::stream_tail() {
  std::vector<std::string> events;
  close_items(events);
  Json output = Json::array();
  for (const StreamItem& item : items_) output.push_back(item.item);
  final_ = response(status(), std::move(output));
  const std::string s = status();
  events.push_back(event({{"type", s == "incomplete" ? "response.incomplete" : "response.completed"}, {"response", final_}}));
  return events;
}

std::vector<std::string> ResponsesBuilder::stream_error(const std::string& request_id) {
  std::vector<std::string> events;
  events.push_back(event({{"type", "error"},
                          {"code", "server_error"},
                          {"message", "The server had an error processing the request (request id " + request_id + ")."},
                          {"param", nullptr}}));
  events.push_back(event({{"type", "response.failed"}, {"response", response("failed", Json::array())}}));
  return events;
}

Json ResponsesBuilder::final_body() {
  final_ = response(status(), output_items());
  return final_;
}

void ResponsesBuilder::finished(bool client_gone) {
  if (client_gone || engine_error_ || meta_.store == nullptr || final_.is_null()) return;
  StoredResponse entry;
  entry.response = final_;
  entry.input_items = meta_.input_items;
  entry.conversation = meta_.conversation;
  for (const Json& item : final_["output"]) {  // without the logprobs: a continuation needs the text
    Json kept = item;
    if (kept["type"] == "message")
      for (Json& part : kept["content"]) part = Json{{"type", part["type"]}, {"text", part["text"]}};
    entry.conversation.push_back(std::move(kept));
  }
  meta_.store->put(meta_.id, std::move(entry));
}

}  // namespace fp8serve
