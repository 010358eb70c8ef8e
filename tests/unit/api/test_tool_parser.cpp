// ToolCallStream: calls read out of model text in the hermes and llama3_json formats, the same
// whether the text arrives whole or one byte at a time, with OpenAI-shaped deltas whose
// arguments concatenate to the final arguments.
#include <catch2/catch.hpp>

#include "server/api/tool_parser.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

struct Parsed {
  std::string content;
  Json calls;
  std::string streamed_content;
  Json streamed_calls = Json::array();  // rebuilt from the deltas, as a client does
};

Parsed parse(ToolCallFormat format, const std::string& text, size_t chunk, int max_calls = 0) {
  Parsed p;
  ToolCallStream whole(format, "seed", max_calls);
  whole.push(text);
  whole.finish();
  p.content = whole.content();
  p.calls = whole.tool_calls();
  ToolCallStream stream(format, "seed", max_calls);
  auto apply = [&](const ToolCallDelta& d) {
    p.streamed_content += d.content;
    for (const Json& item : d.tool_calls) {
      const size_t index = item["index"].get<size_t>();
      if (item.contains("id")) {
        REQUIRE(index == p.streamed_calls.size());  // a call is named before its arguments
        p.streamed_calls.push_back({{"id", item["id"]}, {"type", "function"},
                                    {"function", {{"name", item["function"]["name"]}, {"arguments", ""}}}});
      }
      REQUIRE(index < p.streamed_calls.size());
      std::string args = p.streamed_calls[index]["function"]["arguments"].get<std::string>();
      args += item["function"]["arguments"].get<std::string>();
      p.streamed_calls[index]["function"]["arguments"] = args;
    }
  };
  for (size_t i = 0; i < text.size(); i += chunk) apply(stream.push(text.substr(i, chunk)));
  apply(stream.finish());
  return p;
}

void check_same(const Parsed& p) {
  CHECK(p.streamed_calls == p.calls);
  if (p.calls.empty()) CHECK(p.streamed_content == p.content);
}

}  // namespace

TEST_CASE("hermes: text, then calls; streamed byte by byte or whole, the same") {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, text.size()}) {
    const Parsed p = parse(ToolCallFormat::hermes, text, chunk);
    check_same(p);
    REQUIRE(p.calls.size() == 2);
    CHECK(p.content == "Let me check.");
    CHECK(p.calls[0]["function"]["name"] == "get_weather");
    CHECK(Json::parse(p.calls[0]["function"]["arguments"].get<std::string>()) == Json::parse(R"({"city": "Paris", "days": [1, 2]})"));
    CHECK(p.calls[1]["function"]["arguments"] == "{}");
    CHECK(p.calls[0]["id"] != p.calls[1]["id"]);
    CHECK(p.calls[0]["id"].get<std::string>().rfind("call_", 0) == 0);
  }
}

TEST_CASE("hermes: no call, a broken call and a cut tag stay text") {
  const Parsed plain = parse(ToolCallFormat::hermes, "No tools needed: <tool_ is not a tag.", 2);
  CHECK(plain.calls.empty());
  CHECK(plain.content == "No tools needed: <tool_ is not a tag.");
  CHECK(plain.streamed_content == plain.content);
  const Parsed broken = parse(ToolCallFormat::hermes, "<tool_call>\nnot json</tool_call>", 1);
  CHECK(broken.calls.empty());
  CHECK(broken.content == "<tool_call>\nnot json</tool_call>");
  const Parsed unnamed = parse(ToolCallFormat::hermes, "<tool_call>{\"na", 1);  // cut before the name: text
  CHECK(unnamed.calls.empty());
  CHECK(unnamed.content == "<tool_call>{\"na");
  // Cut after the name (max_tokens): the call stays, with the arguments written so far.
  const Parsed unfinished = parse(ToolCallFormat::hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1", 1);
  REQUIRE(unfinished.calls.size() == 1);
  CHECK(unfinished.calls[0]["function"]["arguments"] == "{\"a\": 1");
  CHECK(unfinished.content.empty());
  check_same(unfinished);
  const Parsed cut = parse(ToolCallFormat::hermes, "Answer <tool_c", 1);
  CHECK(cut.content == "Answer <tool_c");
}

TEST_CASE("hermes: arguments written as a JSON string, and keys in the other order") {
  const Parsed s = parse(ToolCallFormat::hermes, R"(<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>)", 1);
  REQUIRE(s.calls.size() == 1);
  CHECK(s.calls[0]["function"]["arguments"] == "{\"a\": 1}");
  check_same(s);
  const Parsed swapped = parse(ToolCallFormat::hermes, R"(<tool_call>{"arguments": {"x": "}"}, "name": "g"}</tool_call>)", 1);
  REQUIRE(swapped.calls.size() == 1);
  CHECK(swapped.calls[0]["function"]["name"] == "g");
  CHECK(swapped.calls[0]["function"]["arguments"] == R"({"x": "}"})");
  check_same(swapped);
}

TEST_CASE("llama3_json: one or more calls, python_tag, plain text") {
  const Parsed one = parse(ToolCallFormat::llama3_json, R"({"name": "search", "parameters": {"q": "fp8; kv"}})", 1);
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0]["function"]["arguments"] == R"({"q": "fp8; kv"})");
  CHECK(one.content.empty());
  check_same(one);
  const Parsed two = parse(ToolCallFormat::llama3_json, R"(<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"n": 2}})", 4);
  REQUIRE(two.calls.size() == 2);
  CHECK(two.calls[1]["function"]["name"] == "b");
  check_same(two);
  const Parsed text = parse(ToolCallFormat::llama3_json, "The answer is 4.", 1);
  CHECK(text.calls.empty());
  CHECK(text.content == "The answer is 4.");
  CHECK(text.streamed_content == "The answer is 4.");
  const Parsed object = parse(ToolCallFormat::llama3_json, R"({"answer": 4})", 1);  // JSON, but not a call
  CHECK(object.calls.empty());
  CHECK(object.content == R"({"answer": 4})");
}

TEST_CASE("max_calls (parallel_tool_calls: false) keeps the first call, streamed or not; the rest is dropped") {
  const std::string hermes =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
  const std::string llama = R"({"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}})";
  for (const auto& [format, text] : {std::pair{ToolCallFormat::hermes, hermes}, std::pair{ToolCallFormat::llama3_json, llama}}) {
    for (size_t chunk : {size_t{1}, size_t{5}, text.size()}) {
      const Parsed one = parse(format, text, chunk, 1);
      check_same(one);
      REQUIRE(one.calls.size() == 1);
      CHECK(one.calls[0]["function"]["name"] == "a");
      CHECK(one.content.empty());
      CHECK(parse(format, text, chunk, 0).calls.size() == 2);
    }
  }
}

TEST_CASE("ended_inside_call: a call cut by max_tokens, against text cut after complete calls") {
  auto ended_inside = [](const std::string& text) {
    ToolCallStream s(ToolCallFormat::hermes, "seed");
    s.push(text);
    s.finish();
    return std::pair{s.num_calls(), s.ended_inside_call()};
  };
  const std::string call = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  CHECK(ended_inside(call) == std::pair{1, false});
  CHECK(ended_inside(call + "\nThat is all I nee") == std::pair{1, false});
  CHECK(ended_inside(call + "\n<tool_call>\n{\"name\": \"a\", \"argu") == std::pair{2, true});  // announced, cut
  CHECK(ended_inside(call + "\n<tool_call>\n{\"na") == std::pair{1, true});                       // given back as text
  CHECK(ended_inside("Just text") == std::pair{0, false});
}
