// Response shapes against the OpenAI API reference: final objects, stream chunks, usage chunk,
// logprobs in both formats, choice indices across prompts and n.
#include <catch2/catch.hpp>

// GCC 12 at -O3 warns falsely on plain string assignments here (GCC bug 105329, -Wrestrict).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <string>

#include "server/api/responses.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

std::string fake_bytes(int32_t id) { return std::string("t").append(std::to_string(id)); }

RequestOutput out(int index, std::vector<int32_t> tokens, std::string text, std::optional<FinishReason> finish = {},
                  int completion_tokens = 0) {
  RequestOutput o;
  o.index = index;
  o.new_tokens = std::move(tokens);
  o.text_delta = std::move(text);
  o.finish = finish;
  o.prompt_tokens = 5;
  o.completion_tokens = completion_tokens;
  o.cached_tokens = 2;
  return o;
}

Json parse_event(const std::string& e) {
  REQUIRE(e.rfind("data: ", 0) == 0);
  REQUIRE(e.size() >= 8);
  REQUIRE(e.substr(e.size() - 2) == "\n\n");
  return Json::parse(e.substr(6, e.size() - 8));
}

}  // namespace

TEST_CASE("non-streaming completion with n = 2 over two prompts") {
  ResponseMeta meta;
  meta.id = "cmpl-abc";
  meta.created = 1700000000;
  meta.model = "m";
  meta.n = 2;
  meta.num_prompts = 2;
  ResponseBuilder b(meta, fake_bytes);
  CHECK(b.on_output(0, out(0, {1}, "He")).empty());
  b.on_output(1, out(1, {2}, "X", FinishReason::length, 1));
  b.on_output(0, out(0, {3}, "llo", FinishReason::stop, 2));
  CHECK_FALSE(b.done());
  b.on_output(0, out(1, {4}, "A", FinishReason::length, 1));
  b.on_output(1, out(0, {5}, "Y", FinishReason::stop, 1));
  REQUIRE(b.done());
  const Json body = b.final_body();
  CHECK(body["id"] == "cmpl-abc");
  CHECK(body["object"] == "text_completion");
  CHECK(body["created"] == 1700000000);
  REQUIRE(body["choices"].size() == 4);
  CHECK(body["choices"][0]["text"] == "Hello");
  CHECK(body["choices"][0]["finish_reason"] == "stop");
  CHECK(body["choices"][1]["text"] == "A");
  CHECK(body["choices"][2]["text"] == "Y");
  CHECK(body["choices"][3]["text"] == "X");
  CHECK(body["choices"][3]["index"] == 3);
  CHECK(body["choices"][0]["logprobs"].is_null());
  // prompt tokens count once per prompt, completion tokens once per choice.
  CHECK(body["usage"]["prompt_tokens"] == 10);
  CHECK(body["usage"]["completion_tokens"] == 5);
  CHECK(body["usage"]["total_tokens"] == 15);
  CHECK(body["usage"]["prompt_tokens_details"]["cached_tokens"] == 4);
}

TEST_CASE("streaming chat: role chunk, content deltas, finish chunk, usage chunk, [DONE]") {
  ResponseMeta meta;
  meta.kind = ApiKind::chat;
  meta.id = "chatcmpl-1";
  meta.model = "m";
  meta.stream = true;
  meta.include_usage = true;
  ResponseBuilder b(meta, fake_bytes);
  auto head = b.stream_head();
  REQUIRE(head.size() == 1);
  Json first = parse_event(head[0]);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["usage"].is_null());
  // Held-back output (no text, no finish) sends nothing.
  CHECK(b.on_output(0, out(0, {1}, "")).empty());
  auto e1 = b.on_output(0, out(0, {2}, "h\xc3\xa9"));
  REQUIRE(e1.size() == 1);
  CHECK(parse_event(e1[0])["choices"][0]["delta"]["content"] == "h\xc3\xa9");
  auto e2 = b.on_output(0, out(0, {}, "", FinishReason::length, 3));
  REQUIRE(e2.size() == 1);
  Json last = parse_event(e2[0]);
  CHECK(last["choices"][0]["finish_reason"] == "length");
  CHECK(last["choices"][0]["delta"] == Json::object());
  REQUIRE(b.done());
  auto tail = b.stream_tail();
  REQUIRE(tail.size() == 2);
  Json usage = parse_event(tail[0]);
  CHECK(usage["choices"].empty());
  CHECK(usage["usage"]["completion_tokens"] == 3);
  CHECK(tail[1] == "data: [DONE]\n\n");
}

TEST_CASE("streaming completion with echo: the prompt comes first; no usage chunk unless asked") {
  ResponseMeta meta;
  meta.id = "cmpl-2";
  meta.stream = true;
  meta.echo_texts = {"Say: "};
  ResponseBuilder b(meta, fake_bytes);
  auto head = b.stream_head();
  REQUIRE(head.size() == 1);
  CHECK(parse_event(head[0])["choices"][0]["text"] == "Say: ");
  CHECK_FALSE(parse_event(head[0]).contains("usage"));
  b.on_output(0, out(0, {1}, "hi", FinishReason::stop, 1));
  auto tail = b.stream_tail();
  REQUIRE(tail.size() == 1);
  CHECK(tail[0] == kSseDone);
}

TEST_CASE("logprobs: completion and chat formats") {
  RequestOutput o = out(0, {7, 8}, "ab", FinishReason::stop, 2);
  o.logprobs = {{7, -0.5f, {{7, -0.5f}, {9, -1.5f}}}, {8, -0.25f, {{8, -0.25f}, {7, -2.0f}}}};
  ResponseMeta meta;
  meta.num_logprobs = 2;
  ResponseBuilder c(meta, fake_bytes);
  c.on_output(0, o);
  Json lp = c.final_body()["choices"][0]["logprobs"];
  CHECK(lp["tokens"] == Json::array({"t7", "t8"}));
  CHECK(lp["token_logprobs"] == Json::array({-0.5, -0.25}));
  CHECK(lp["top_logprobs"][0]["t9"] == -1.5);
  CHECK(lp["text_offset"] == Json::array({0, 2}));

  meta.kind = ApiKind::chat;
  ResponseBuilder h(meta, fake_bytes);
  h.on_output(0, o);
  Json content = h.final_body()["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 2);
  CHECK(content[0]["token"] == "t7");
  CHECK(content[0]["bytes"] == Json::array({'t', '7'}));
  CHECK(content[1]["top_logprobs"][1]["token"] == "t7");
  CHECK(content[1]["top_logprobs"][1]["logprob"] == -2.0);
}

TEST_CASE("errors and aborts end a stream without a finish chunk; dump survives invalid UTF-8") {
  ResponseMeta meta;
  meta.stream = true;
  ResponseBuilder b(meta, fake_bytes);
  RequestOutput e = out(0, {}, "", FinishReason::error);
  e.error = "boom";
  CHECK(b.on_output(0, e).empty());
  CHECK(b.done());
  CHECK(b.engine_error() == std::string("boom"));
  CHECK(dump_json(Json{{"t", "\xff"}}) == "{\"t\":\"\xef\xbf\xbd\"}");
}

TEST_CASE("logprob tokens cut inside a UTF-8 character print as U+FFFD and merge as one dict key") {
  auto bytes_of = [](int32_t id) -> std::string { return id == 1 ? "\xe6" : id == 2 ? "\xe3" : "\xc3\xa9"; };
  RequestOutput o = out(0, {1}, "", FinishReason::stop, 1);
  o.logprobs = {{1, -0.5f, {{1, -0.5f}, {2, -0.7f}, {3, -0.9f}}}};
  ResponseMeta meta;
  meta.num_logprobs = 3;
  ResponseBuilder c(meta, bytes_of);
  c.on_output(0, o);
  Json lp = c.final_body()["choices"][0]["logprobs"];
  CHECK(lp["tokens"][0] == "\xef\xbf\xbd");
  CHECK(lp["top_logprobs"][0].size() == 2);
  CHECK(lp["top_logprobs"][0]["\xef\xbf\xbd"] == -0.5);
  CHECK(lp["top_logprobs"][0]["\xc3\xa9"] == Approx(-0.9));
  meta.kind = ApiKind::chat;
  ResponseBuilder h(meta, bytes_of);
  h.on_output(0, o);
  Json content = h.final_body()["choices"][0]["logprobs"]["content"];
  CHECK(content[0]["token"] == "\xef\xbf\xbd");
  CHECK(content[0]["bytes"] == Json::array({0xe6}));
  CHECK(content[0]["top_logprobs"][2]["token"] == "\xc3\xa9");
}

TEST_CASE("best_of: the n choices of highest cumulative logprob, best first, renumbered; usage counts all") {
  ResponseMeta meta;
  meta.n = 2;
  meta.best_of = 4;
  meta.num_prompts = 2;
  ResponseBuilder b(meta, fake_bytes);
  // Prompt p, candidate i: two tokens whose logprobs sum to -sums[p][i].
  const double sums[2][4] = {{3.0, 1.0, 2.0, 0.5}, {1.0, 1.0, 4.0, 2.0}};
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < 4; ++i) {
      RequestOutput o = out(i, {10 * p + i, 7}, "p" + std::to_string(p) + "c" + std::to_string(i), FinishReason::length, 2);
      o.logprobs = {SampleResult{10 * p + i, static_cast<float>(-sums[p][i] / 2), {}}, SampleResult{7, static_cast<float>(-sums[p][i] / 2), {}}};
      b.on_output(p, o);
    }
  }
  REQUIRE(b.done());
  const Json body = b.final_body();
  REQUIRE(body["choices"].size() == 4);
  const char* expected[] = {"p0c3", "p0c1", "p1c0", "p1c1"};  // ties keep generation order
  for (int k = 0; k < 4; ++k) {
    CHECK(body["choices"][k]["index"] == k);
    CHECK(body["choices"][k]["text"] == expected[k]);
    CHECK(body["choices"][k]["logprobs"].is_null());  // not asked for
  }
  CHECK(body["usage"]["completion_tokens"] == 16);  // every candidate's tokens
}

TEST_CASE("return_tokens_as_token_ids: logprobs tokens are token_id:N") {
  ResponseMeta meta;
  meta.kind = ApiKind::chat;
  meta.num_logprobs = 1;
  meta.tokens_as_ids = true;
  ResponseBuilder b(meta, fake_bytes);
  RequestOutput o = out(0, {42}, "x", FinishReason::stop, 1);
  o.logprobs = {SampleResult{42, -0.5f, {{42, -0.5f}}}};
  b.on_output(0, o);
  const Json lp = b.final_body()["choices"][0]["logprobs"]["content"][0];
  CHECK(lp["token"] == "token_id:42");
  CHECK(lp["top_logprobs"][0]["token"] == "token_id:42");
  CHECK(lp["bytes"] == Json::array({'t', '4', '2'}));
}

TEST_CASE("echo with logprobs: the prompt's tokens lead the logprobs object; prompt_logprobs in vLLM's shape") {
  ResponseMeta meta;
  meta.id = "cmpl-e";
  meta.model = "m";
  meta.num_logprobs = 1;
  meta.echo_texts = {"t7t8t9"};
  meta.echo_logprobs = true;
  meta.num_prompt_logprobs = 1;
  meta.prompt_ids = {{7, 8, 9}};
  for (const bool stream : {false, true}) {
    meta.stream = stream;
    ResponseBuilder b(meta, fake_bytes);
    RequestOutput first = out(0, {4}, "t4");
    first.prompt_logprobs = {{8, -0.5f, {{8, -0.5f}}, 1}, {9, -2.0f, {{3, -0.25f}}, 4}};
    first.logprobs = {{4, -0.125f, {{4, -0.125f}}, 0}};
    auto events = b.on_output(0, first);
    RequestOutput last = out(0, {}, "", FinishReason::length, 1);
    for (auto& e : b.on_output(0, last)) events.push_back(e);
    Json lp, choice;
    std::string text;
    if (!stream) {
      CHECK(events.empty());
      choice = b.final_body()["choices"][0];
      lp = choice["logprobs"];
      text = choice["text"];
      // vLLM's prompt_logprobs: null, then the prompt token first with its rank, then the top N.
      const Json& pl = choice["prompt_logprobs"];
      REQUIRE(pl.size() == 3);
      CHECK(pl[0].is_null());
      CHECK(pl[1].dump() == R"({"8":{"logprob":-0.5,"rank":1,"decoded_token":"t8"}})");
      CHECK(pl[2].dump() ==
            R"({"9":{"logprob":-2.0,"rank":4,"decoded_token":"t9"},"3":{"logprob":-0.25,"rank":1,"decoded_token":"t3"}})");
    } else {
      for (const auto& head : b.stream_head()) CHECK(parse_event(head)["choices"][0].value("text", "") != "t7t8t9");
      REQUIRE(!events.empty());
      const Json c = parse_event(events[0])["choices"][0];
      lp = c["logprobs"];
      text = c["text"];  // the echo comes with its logprobs, in the first chunk
    }
    CHECK(text == "t7t8t9t4");
    CHECK(lp["tokens"] == Json::array({"t7", "t8", "t9", "t4"}));
    CHECK(lp["token_logprobs"].dump() == "[null,-0.5,-2.0,-0.125]");
    CHECK(lp["top_logprobs"][0].is_null());
    CHECK(lp["top_logprobs"][2].dump() == R"({"t3":-0.25})");
    CHECK(lp["text_offset"] == Json::array({0, 2, 4, 6}));
  }
}

TEST_CASE("tool calls: finish_reason tool_calls whenever the calls are complete, one call with max_tool_calls 1") {
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  auto answer = [&](bool stream, const std::string& text, FinishReason finish, int max_calls) {
    ResponseMeta meta;
    meta.kind = ApiKind::chat;
    meta.id = "chatcmpl-t";
    meta.stream = stream;
    meta.tool_parser = ToolCallFormat::hermes;
    meta.max_tool_calls = max_calls;
    ResponseBuilder b(meta, fake_bytes);
    std::vector<std::string> events = b.on_output(0, out(0, {1}, text));
    for (std::string& e : b.on_output(0, out(0, {}, "", finish, 9))) events.push_back(std::move(e));
    if (!stream) {
      const Json body = b.final_body();
      return std::pair{body["choices"][0]["finish_reason"], body["choices"][0]["message"].value("tool_calls", Json::array()).size()};
    }
    Json reason;
    size_t calls = 0;
    for (const std::string& e : events) {
      const Json c = parse_event(e)["choices"][0];
      if (!c["finish_reason"].is_null()) reason = c["finish_reason"];
      if (c["delta"].contains("tool_calls"))
        for (const Json& d : c["delta"]["tool_calls"]) calls += d.contains("id");
    }
    return std::pair{reason, calls};
  };
  for (const bool stream : {false, true}) {
    INFO("stream " << stream);
    CHECK(answer(stream, call + "\n" + call, FinishReason::stop, 0) == std::pair{Json("tool_calls"), size_t{2}});
    CHECK(answer(stream, call + "\n" + call, FinishReason::stop, 1) == std::pair{Json("tool_calls"), size_t{1}});
    // Cut by max_tokens after the calls: they are complete. Cut inside one: "length".
    CHECK(answer(stream, call + "\nDone, I ha", FinishReason::length, 0) == std::pair{Json("tool_calls"), size_t{1}});
    CHECK(answer(stream, call + "\n<tool_call>\n{\"name\": \"f\", \"argu", FinishReason::length, 0).first == "length");
    CHECK(answer(stream, "No call here", FinishReason::length, 0) == std::pair{Json("length"), size_t{0}});
  }
}
