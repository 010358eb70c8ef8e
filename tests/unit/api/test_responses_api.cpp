// OpenAI's Responses API without sockets: the request's translation into chat messages, the
// response object and the stream's typed events against OpenAI's reference, and the store's caps.
#include <catch2/catch.hpp>

// GCC 12 at -O3 warns falsely on plain string assignments here (GCC bug 105329, -Wrestrict).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <string>

#include "server/api/response_store.hpp"
#include "server/api/responses_output.hpp"
#include "server/api/responses_request.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

ResponsesRequest parse_ok(const Json& body) {
  auto parsed = parse_responses_request(body.dump(), ApiLimits{}, "rid");
  if (auto* e = std::get_if<ApiError>(&parsed)) FAIL(e->message);
  return std::get<ResponsesRequest>(parsed);
}

ApiError parse_error(const Json& body) {
  auto parsed = parse_responses_request(body.dump(), ApiLimits{}, "rid");
  REQUIRE(std::holds_alternative<ApiError>(parsed));
  return std::get<ApiError>(parsed);
}

RequestOutput out(std::string text, std::vector<int32_t> tokens, std::optional<FinishReason> finish = {}, int completion = 0) {
  RequestOutput o;
  o.text_delta = std::move(text);
  o.new_tokens = std::move(tokens);
  o.finish = finish;
  o.prompt_tokens = 7;
  o.cached_tokens = 3;
  o.completion_tokens = completion;
  return o;
}

ResponseMeta chat_meta(bool stream) {
  ResponseMeta m;
  m.kind = ApiKind::chat;
  m.id = "chatcmpl-rid";
  m.model = "m";
  m.stream = stream;
  m.prompt_tokens = {7};
  return m;
}

ResponsesMeta responses_meta(ResponseStore* store = nullptr) {
  ResponsesMeta m;
  m.id = "resp_rid";
  m.created_at = 1700000000;
  m.echo = {{"instructions", nullptr}, {"store", store != nullptr}};
  m.store = store;
  m.input_items = Json::array({{{"type", "message"}, {"id", "msg_in"}, {"role", "user"},
                                {"content", Json::array({{{"type", "input_text"}, {"text", "hi"}}})}}});
  m.conversation = m.input_items;
  return m;
}

std::string bytes_of(int32_t id) { return "t" + std::to_string(id); }

// "event: T\ndata: {...}\n\n" -> the data, whose type must be T.
Json parse_event(const std::string& e) {
  REQUIRE(e.rfind("event: ", 0) == 0);
  const size_t nl = e.find('\n');
  const std::string type = e.substr(7, nl - 7);
  REQUIRE(e.compare(nl + 1, 6, "data: ") == 0);
  REQUIRE(e.substr(e.size() - 2) == "\n\n");
  Json data = Json::parse(e.substr(nl + 7, e.size() - nl - 9));
  CHECK(data["type"] == type);
  return data;
}

}  // namespace

TEST_CASE("responses input: a string, messages, function calls and their outputs become chat messages") {
  const ResponsesRequest s = parse_ok({{"input", "Hi"}, {"instructions", "Be brief."}});
  const Json m = items_to_messages(s.input_items, s.instructions);
  CHECK(m == Json::parse(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}])"));
  CHECK(s.input_items[0]["id"] == "msg_rid_0");
  CHECK(s.store);

  const ResponsesRequest r = parse_ok(Json::parse(R"({"input": [
      {"role": "developer", "content": "Rules."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "message", "role": "assistant", "id": "msg_prev", "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
      {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"x\": 1}"},
      {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "one"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]}],
      "store": false})"));
  CHECK_FALSE(r.store);
  CHECK(r.input_items[2]["id"] == "msg_prev");  // a client's own ids are kept
  CHECK(r.input_items[3]["id"] == "fc_rid_3");
  const Json chat = items_to_messages(r.input_items, std::nullopt);
  REQUIRE(chat.size() == 5);
  CHECK(chat[0] == Json{{"role", "system"}, {"content", "Rules."}});
  CHECK(chat[1]["content"] == "a\nb");
  CHECK(chat[2]["role"] == "assistant");
  CHECK(chat[2]["content"] == "Let me look.");  // the calls join the message before them
  REQUIRE(chat[2]["tool_calls"].size() == 2);
  CHECK(chat[2]["tool_calls"][1] == Json::parse(R"({"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}})"));
  CHECK(chat[3] == Json{{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "one"}});
  CHECK(chat[4]["content"] == "two");

  // Calls with no assistant message before them open one.
  const ResponsesRequest c = parse_ok(Json::parse(
      R"({"input": [{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]})"));
  const Json cm = items_to_messages(c.input_items, std::nullopt);
  CHECK(cm[1]["role"] == "assistant");
  CHECK(cm[1]["content"].is_null());
}

TEST_CASE("responses request: tools, tool_choice, text.format and include translate to chat's fields") {
  const ResponsesRequest r = parse_ok(Json::parse(R"({"input": "x", "max_output_tokens": 9, "temperature": 0,
      "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}],
      "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false,
      "include": ["message.output_text.logprobs"], "top_logprobs": 3, "metadata": {"k": "v"}})"));
  CHECK(r.chat["max_completion_tokens"] == 9);
  CHECK(r.chat["tools"][0] ==
        Json::parse(R"({"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"},"strict":true}})"));
  CHECK(r.chat["tool_choice"] == Json::parse(R"({"type":"function","function":{"name":"f"}})"));
  CHECK(r.chat["parallel_tool_calls"] == false);
  CHECK(r.chat["logprobs"] == true);
  CHECK(r.chat["top_logprobs"] == 3);
  CHECK(r.echo["metadata"] == Json{{"k", "v"}});
  CHECK(r.echo["tools"][0]["name"] == "f");  // echoed in the Responses shape

  const ResponsesRequest j = parse_ok(Json::parse(
      R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": true}}})"));
  CHECK(j.chat["response_format"] ==
        Json::parse(R"({"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"},"strict":true}})"));
  CHECK(parse_ok(Json::parse(R"({"input": "x", "text": {"format": {"type": "text"}}})")).chat["response_format"].is_null());
}

TEST_CASE("responses request: what does not apply is a 400 naming it") {
  CHECK(parse_error(Json::parse(R"({"input": [{"type": "bogus"}]})")).param == "input[0].type");
  CHECK(parse_error(Json::parse(R"({"input": [{"type": "item_reference", "id": "x"}]})")).code == "unsupported_parameter");
  const ApiError image = parse_error(Json::parse(
      R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]})"));
  CHECK(image.param == "input[0].content[0]");
  CHECK(image.code == "unsupported_parameter");
  CHECK(parse_error(Json::parse(R"({"input": [{"role": "tool", "content": "x"}]})")).param == "input[0].role");
  CHECK(parse_error(Json::parse(R"({"input": []})")).param == "input");
  CHECK(parse_error(Json::parse(R"({"instructions": "x"})")).param == "input");
  CHECK(parse_error(Json::parse(R"({"input": "x", "tools": [{"type": "file_search", "vector_store_ids": []}]})")).param == "tools[0]");
  CHECK(parse_error(Json::parse(R"({"input": "x", "tool_choice": {"type": "web_search_preview"}})")).code == "unsupported_parameter");
  CHECK(parse_error(Json::parse(R"({"input": "x", "text": {"verbosity": "low"}})")).param == "text.verbosity");
  CHECK(parse_error(Json::parse(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}})")).param ==
        "text.format.schema");
  CHECK(parse_error(Json::parse(R"({"input": "x", "reasoning": {"summary": "auto"}})")).param == "reasoning");
  CHECK(parse_error(Json::parse(R"({"input": "x", "metadata": {"k": 1}})")).param == "metadata");
  Json many = {{"input", Json::array()}};
  for (int i = 0; i < 4097; ++i) many["input"].push_back({{"role", "user"}, {"content", "x"}});
  CHECK(parse_error(many).param == "input");
  CHECK(parse_error(Json::parse(R"([1, 2])")).status == 400);
  // Chat's errors, renamed.
  const ApiError renamed = responses_error(bad_request("'max_completion_tokens' must be in [1, 9], got 0.", "max_completion_tokens"));
  CHECK(renamed.param == "max_output_tokens");
  CHECK(renamed.message == "'max_output_tokens' must be in [1, 9], got 0.");
  CHECK(responses_error(bad_request("x", "response_format.json_schema")).param == "text.format.json_schema");
}

TEST_CASE("responses object: a message, usage, incomplete when max_output_tokens cut it; stored when asked") {
  ResponseStore store;
  ResponsesBuilder b(responses_meta(&store), chat_meta(false), bytes_of);
  CHECK(b.on_output(0, out("Hel", {1})).empty());
  CHECK_FALSE(b.done());
  b.on_output(0, out("lo", {2}, FinishReason::length, 2));
  REQUIRE(b.done());
  const Json r = b.final_body();
  CHECK(r["id"] == "resp_rid");
  CHECK(r["object"] == "response");
  CHECK(r["status"] == "incomplete");
  CHECK(r["incomplete_details"] == Json{{"reason", "max_output_tokens"}});
  REQUIRE(r["output"].size() == 1);
  const Json& msg = r["output"][0];
  CHECK(msg["type"] == "message");
  CHECK(msg["id"] == "msg_rid");
  CHECK(msg["role"] == "assistant");
  CHECK(msg["status"] == "incomplete");
  CHECK(msg["content"][0] == Json::parse(R"({"type":"output_text","text":"Hello","annotations":[],"logprobs":[]})"));
  CHECK(r["usage"] == Json::parse(R"({"input_tokens":7,"input_tokens_details":{"cached_tokens":3},"output_tokens":2,
                                      "output_tokens_details":{"reasoning_tokens":0},"total_tokens":9})"));
  CHECK(r["store"] == true);
  CHECK(store.size() == 0);
  b.finished(/*client_gone=*/false);
  const auto stored = store.get("resp_rid");
  REQUIRE(stored);
  CHECK(stored->response == r);
  REQUIRE(stored->conversation.size() == 2);  // the input, then the output (without logprobs)
  CHECK(stored->conversation[1]["content"][0] == Json{{"type", "output_text"}, {"text", "Hello"}});

  ResponseStore gone;
  ResponsesBuilder g(responses_meta(&gone), chat_meta(false), bytes_of);
  g.on_output(0, out("x", {1}, FinishReason::stop, 1));
  g.final_body();
  g.finished(/*client_gone=*/true);
  CHECK(gone.size() == 0);
}

TEST_CASE("responses object: tool calls come out as function_call items; logprobs in the output_text") {
  ResponseMeta chat = chat_meta(false);
  chat.tool_parser = ToolCallFormat::hermes;
  chat.num_logprobs = 1;
  ResponsesBuilder b(responses_meta(), chat, bytes_of);
  RequestOutput o = out("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>", {5}, FinishReason::stop, 1);
  o.logprobs.push_back(SampleResult{5, -0.5f, {TokenLogprob{5, -0.5f}}, 1});
  b.on_output(0, o);
  const Json r = b.final_body();
  CHECK(r["status"] == "completed");
  REQUIRE(r["output"].size() == 1);
  const Json& call = r["output"][0];
  CHECK(call["type"] == "function_call");
  CHECK(call["name"] == "f");
  CHECK(Json::parse(call["arguments"].get<std::string>()) == Json{{"x", 1}});
  CHECK(call["id"] == "fc_" + call["call_id"].get<std::string>().substr(5));

  ResponsesBuilder t(responses_meta(), [] {
    ResponseMeta m = chat_meta(false);
    m.num_logprobs = 1;
    return m;
  }(), bytes_of);
  RequestOutput lo = out("A", {9}, FinishReason::stop, 1);
  lo.logprobs.push_back(SampleResult{9, -0.25f, {TokenLogprob{9, -0.25f}}, 1});
  t.on_output(0, lo);
  const Json lp = t.final_body()["output"][0]["content"][0]["logprobs"];
  REQUIRE(lp.size() == 1);
  CHECK(lp[0]["token"] == "t9");
  CHECK(lp[0]["logprob"] == -0.25f);
  CHECK(lp[0]["bytes"] == Json::array({116, 57}));
  CHECK(lp[0]["top_logprobs"].size() == 1);
}

TEST_CASE("responses stream: OpenAI's event order with sequence numbers; the final text is the deltas'") {
  ResponsesBuilder b(responses_meta(), chat_meta(true), bytes_of);
  std::vector<Json> events;
  auto take = [&](const std::vector<std::string>& raw) {
    for (const std::string& e : raw) events.push_back(parse_event(e));
  };
  take(b.stream_head());
  take(b.on_output(0, out("He", {1})));
  take(b.on_output(0, out("llo", {2}, FinishReason::stop, 2)));
  REQUIRE(b.done());
  take(b.stream_tail());
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i]["sequence_number"] == i);
    types.push_back(events[i]["type"].get<std::string>());
  }
  CHECK(types == std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                          "response.content_part.added", "response.output_text.delta",
                                          "response.output_text.delta", "response.output_text.done",
                                          "response.content_part.done", "response.output_item.done", "response.completed"});
  CHECK(events[0]["response"]["status"] == "in_progress");
  CHECK(events[0]["response"]["usage"].is_null());
  CHECK(events[4]["delta"] == "He");
  CHECK(events[6]["text"] == "Hello");
  const Json& done = events.back()["response"];
  CHECK(done["status"] == "completed");
  CHECK(done["output"][0]["content"][0]["text"] == "Hello");
  CHECK(done["output"][0]["id"] == events[2]["item"]["id"]);
  CHECK(done["usage"]["output_tokens"] == 2);

  // Cut by max_output_tokens: response.incomplete; an empty answer still announces its message.
  ResponsesBuilder e(responses_meta(), chat_meta(true), bytes_of);
  std::vector<Json> ev;
  for (const auto& s : e.stream_head()) ev.push_back(parse_event(s));
  for (const auto& s : e.on_output(0, out("", {3}, FinishReason::length, 1))) ev.push_back(parse_event(s));
  for (const auto& s : e.stream_tail()) ev.push_back(parse_event(s));
  CHECK(ev[2]["type"] == "response.output_item.added");
  CHECK(ev.back()["type"] == "response.incomplete");
  CHECK(ev.back()["response"]["output"][0]["status"] == "incomplete");
}

TEST_CASE("responses stream: a tool call's item, its argument deltas, done events") {
  ResponseMeta chat = chat_meta(true);
  chat.tool_parser = ToolCallFormat::hermes;
  ResponsesBuilder b(responses_meta(), chat, bytes_of);
  std::vector<Json> events;
  for (const auto& s : b.stream_head()) events.push_back(parse_event(s));
  for (const char* piece : {"<tool_call>{\"name\": \"f\", ", "\"arguments\": {\"x\": ", "1}}</tool_call>"})
    for (const auto& s : b.on_output(0, out(piece, {1}))) events.push_back(parse_event(s));
  for (const auto& s : b.on_output(0, out("", {2}, FinishReason::stop, 4))) events.push_back(parse_event(s));
  for (const auto& s : b.stream_tail()) events.push_back(parse_event(s));
  std::string arguments;
  std::vector<std::string> kinds;
  for (const Json& e : events) {
    kinds.push_back(e["type"].get<std::string>());
    if (e["type"] == "response.function_call_arguments.delta") arguments += e["delta"].get<std::string>();
  }
  CHECK(kinds[2] == "response.output_item.added");
  CHECK(events[2]["item"]["type"] == "function_call");
  CHECK(events[2]["item"]["name"] == "f");
  CHECK(Json::parse(arguments) == Json{{"x", 1}});
  const auto at = [&](const char* t) { return std::find(kinds.begin(), kinds.end(), t) - kinds.begin(); };
  CHECK(at("response.function_call_arguments.done") < at("response.output_item.done"));
  CHECK(events[static_cast<size_t>(at("response.function_call_arguments.done"))]["arguments"] == arguments);
  CHECK(kinds.back() == "response.completed");
  CHECK(std::count(kinds.begin(), kinds.end(), "response.output_text.delta") == 0);
  CHECK(events.back()["response"]["output"][0]["call_id"] == events[2]["item"]["call_id"]);
}

TEST_CASE("responses stream: an engine error is an error event and response.failed") {
  ResponsesBuilder b(responses_meta(), chat_meta(true), bytes_of);
  b.stream_head();
  RequestOutput o = out("", {}, FinishReason::error);
  o.error = "boom";
  CHECK(b.on_output(0, o).empty());
  REQUIRE(b.engine_error());
  const auto events = b.stream_error("rid");
  REQUIRE(events.size() == 2);
  CHECK(parse_event(events[0])["type"] == "error");
  const Json failed = parse_event(events[1]);
  CHECK(failed["type"] == "response.failed");
  CHECK(failed["response"]["status"] == "failed");
  CHECK(failed["sequence_number"] == 3);
}

TEST_CASE("response store: oldest first past the entry and byte caps; expiry; delete") {
  auto now = std::chrono::steady_clock::time_point{};
  ResponseStore store({/*max_entries=*/2, /*max_bytes=*/1 << 20, /*ttl_s=*/60}, [&] { return now; });
  auto entry = [](const std::string& text) { return StoredResponse{Json{{"t", text}}, Json::array(), Json::array()}; };
  CHECK(store.put("a", entry("1")));
  CHECK(store.put("b", entry("2")));
  CHECK(store.put("c", entry("3")));
  CHECK(store.get("a") == nullptr);
  REQUIRE(store.get("b"));
  CHECK(store.get("b")->response["t"] == "2");
  CHECK(store.size() == 2);
  CHECK(store.erase("b"));
  CHECK_FALSE(store.erase("b"));
  CHECK(store.get("b") == nullptr);
  now += std::chrono::seconds(61);
  CHECK(store.get("c") == nullptr);  // expired
  CHECK(store.size() == 0);
  CHECK(store.bytes() == 0);

  ResponseStore small({100, /*max_bytes=*/200, 60});
  CHECK_FALSE(small.put("big", entry(std::string(300, 'x'))));  // alone over the cap: not stored
  CHECK(small.put("x", entry(std::string(100, 'x'))));
  CHECK(small.put("y", entry(std::string(100, 'y'))));  // the two together exceed 200 bytes
  CHECK(small.get("x") == nullptr);
  CHECK(small.get("y") != nullptr);
  CHECK(small.bytes() <= 200);

  ResponseStore none({0, 1 << 20, 60});
  CHECK_FALSE(none.put("a", entry("1")));
}
