// OpenAI's Responses API on the front end: POST /v1/responses is translated into the chat request
// it runs as (responses_request.hpp), prepared by the same code as /v1/chat/completions, and its
// outputs shaped by a ResponsesBuilder; GET / DELETE /v1/responses/{id} and
// GET /v1/responses/{id}/input_items read the store.
#include <algorithm>
#include <charconv>
#include <ctime>

#include "server/api/frontend.hpp"
#include "server/api/responses_output.hpp"
#include "server/api/responses_request.hpp"

namespace fp8serve {

using Json = nlohmann::ordered_json;

namespace {

// "limit=5&order=asc" -> the value of `key`, if given.
std::optional<std::string> query_value(const std::string& target, const std::string& key) {
  const size_t q = target.find('?');
  if (q == std::string::npos) return std::nullopt;
  const std::string query = target.substr(q + 1);
  size_t at = 0;
  while (at <= query.size()) {
    const size_t end = std::min(query.find('&', at), query.size());
    const std::string pair = query.substr(at, end - at);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == key) return eq == std::string::npos ? std::string() : pair.substr(eq + 1);
    at = end + 1;
  }
  return std::nullopt;
}

}  // namespace

RouteResult ApiFrontend::handle_responses(const HttpRequestIn& request) {
  auto parsed = parse_responses_request(request.body, options_.limits, request.request_id);
  if (auto* error = std::get_if<ApiError>(&parsed)) return error_reply(*error);
  ResponsesRequest& q = std::get<ResponsesRequest>(parsed);
  Json conversation = Json::array();
  if (q.previous_response_id) {
    const auto previous = responses_.get(*q.previous_response_id);
    if (!previous)
      return error_reply(bad_request("Previous response with id '" + *q.previous_response_id +
                                         "' not found (never stored, deleted, or evicted from this server's store).",
                                     "previous_response_id", "previous_response_not_found"));
    conversation = previous->conversation;
  }
  for (const Json& item : q.input_items) conversation.push_back(item);
  q.chat["messages"] = items_to_messages(conversation, q.instructions);
  auto chat = parse_api_request(dump_json(q.chat), ApiKind::chat, options_.limits);
  if (auto* error = std::get_if<ApiError>(&chat)) return error_reply(responses_error(*error));
  Prepared prepared = prepare_generation(request.request_id, std::get<ApiRequest>(chat), ApiKind::chat, /*render=*/false);
  if (auto* error = std::get_if<ApiError>(&prepared)) return error_reply(responses_error(*error));
  GenerationJob job = std::move(std::get<GenerationJob>(prepared));

  ResponsesMeta meta;
  meta.id = "resp_" + request.request_id;
  meta.created_at = static_cast<int64_t>(std::time(nullptr));
  meta.echo = std::move(q.echo);
  meta.store = q.store ? &responses_ : nullptr;
  meta.input_items = std::move(q.input_items);
  meta.conversation = std::move(conversation);
  job.builder = std::make_unique<ResponsesBuilder>(std::move(meta), job.builder->meta(), token_bytes_fn());
  return job;
}

HttpReply ApiFrontend::handle_stored_response(const HttpRequestIn& request, const std::string& rest) {
  const size_t slash = rest.find('/');
  const std::string id = rest.substr(0, slash);
  const std::string sub = slash == std::string::npos ? "" : rest.substr(slash + 1);
  if (id.empty() || (!sub.empty() && sub != "input_items"))
    return error_reply(not_found("Route " + request.target.substr(0, request.target.find('?')) + " not found.", "not_found"));
  if (!sub.empty() && request.method == "DELETE") {
    HttpReply reply = error_reply(method_not_allowed(request.method, "/v1/responses/{id}/input_items"));
    reply.headers.emplace_back("Allow", "GET, HEAD");
    return reply;
  }
  const auto stored = responses_.get(id);
  if (!stored) return error_reply(not_found("No response found with id '" + id + "'.", "not_found"));
  if (request.method == "DELETE") {
    responses_.erase(id);
    return json_reply({{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  if (sub.empty()) return json_reply(stored->response);

  // input_items: OpenAI's cursor list (limit 1..100, order desc by default, after = an item id).
  int limit = 20;
  if (const auto v = query_value(request.target, "limit")) {
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), limit);
    if (ec != std::errc() || end != v->data() + v->size() || limit < 1 || limit > 100)
      return error_reply(bad_request("'limit' must be an integer in [1, 100].", "limit"));
  }
  const std::string order = query_value(request.target, "order").value_or("desc");
  if (order != "asc" && order != "desc") return error_reply(bad_request("'order' must be asc or desc.", "order"));
  std::vector<const Json*> items;
  for (const Json& item : stored->input_items) items.push_back(&item);
  if (order == "desc") std::reverse(items.begin(), items.end());
  size_t first = 0;
  if (const auto after = query_value(request.target, "after")) {
    const auto it = std::find_if(items.begin(), items.end(), [&](const Json* item) { return (*item)["id"] == *after; });
    if (it == items.end()) return error_reply(bad_request("'after': no input item with id '" + *after + "'.", "after"));
    first = static_cast<size_t>(it - items.begin()) + 1;
  }
  Json data = Json::array();
  for (size_t i = first; i < items.size() && data.size() < static_cast<size_t>(limit); ++i) data.push_back(*items[i]);
  const bool more = first + data.size() < items.size();
  Json first_id = data.empty() ? Json(nullptr) : data.front()["id"];
  Json last_id = data.empty() ? Json(nullptr) : data.back()["id"];
  return json_reply({{"object", "list"}, {"data", std::move(data)}, {"first_id", first_id}, {"last_id", last_id}, {"has_more", more}});
}

}  // namespace fp8serve
