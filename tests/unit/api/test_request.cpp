// Request parsing and validation: the 400 matrix of issue 6 (every deterministic input error
// names its parameter), and the accepted forms of prompt / messages / stop / logprobs.
#include <catch2/catch.hpp>

#include <string>

#include "server/api/request.hpp"
#include "server/api/request_features.hpp"

using namespace fp8serve;

namespace {

ApiRequest ok(const std::string& body, ApiKind kind = ApiKind::completion) {
  auto r = parse_api_request(body, kind);
  if (auto* e = std::get_if<ApiError>(&r)) FAIL("unexpected error: " << e->message << " for " << body);
  return std::get<ApiRequest>(r);
}

ApiError bad(const std::string& body, ApiKind kind = ApiKind::completion) {
  auto r = parse_api_request(body, kind);
  REQUIRE(std::holds_alternative<ApiError>(r));
  return std::get<ApiError>(r);
}

}  // namespace

TEST_CASE("completion prompts: string, strings, token ids, lists of token ids") {
  auto a = ok(R"({"prompt": "hello"})");
  REQUIRE(a.prompts.size() == 1);
  CHECK(*a.prompts[0].text == "hello");
  CHECK(a.max_tokens == std::nullopt);
  CHECK(a.sampling.temperature == 1.0f);  // OpenAI's default

  auto b = ok(R"({"prompt": ["a", "b", "c"]})");
  REQUIRE(b.prompts.size() == 3);
  CHECK(*b.prompts[2].text == "c");

  auto c = ok(R"({"prompt": [1, 2, 3]})");
  REQUIRE(c.prompts.size() == 1);
  CHECK_FALSE(c.prompts[0].text);
  CHECK(c.prompts[0].tokens == std::vector<int32_t>{1, 2, 3});

  auto d = ok(R"({"prompt": [[1, 2], [3]]})");
  REQUIRE(d.prompts.size() == 2);
  CHECK(d.prompts[1].tokens == std::vector<int32_t>{3});
}

TEST_CASE("sampling parameters land in SamplingParams") {
  auto r = ok(R"({"prompt": "x", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
                  "seed": -1, "stop": "END", "n": 3, "stream": true, "stream_options": {"include_usage": true},
                  "logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
                  "ignore_eos": true, "user": "u"})");
  CHECK(r.max_tokens == 7);
  CHECK(r.sampling.temperature == 0.5f);
  CHECK(r.sampling.top_p == 0.9f);
  CHECK(r.sampling.top_k == 40);
  CHECK(r.sampling.min_p == 0.1f);
  CHECK(r.sampling.seed == static_cast<uint64_t>(-1));
  CHECK(r.stop == std::vector<std::string>{"END"});
  CHECK(r.n == 3);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.sampling.num_logprobs == 2);
  CHECK(r.sampling.presence_penalty == 0.5f);
  CHECK(r.sampling.frequency_penalty == -0.5f);
  CHECK(r.sampling.repetition_penalty == 1.1f);
  CHECK(r.ignore_eos);
  CHECK(ok(R"({"prompt": "x", "top_k": -1})").sampling.top_k == 0);  // vLLM's "off"
  CHECK(ok(R"({"prompt": "x", "max_tokens": 5.0})").max_tokens == 5);
  CHECK(ok(R"({"prompt": "x", "max_tokens": null})").max_tokens == std::nullopt);
}

TEST_CASE("chat: messages, text parts, logprobs, max_completion_tokens") {
  auto r = ok(R"({"messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                  "max_tokens": 4, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})",
              ApiKind::chat);
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[1]["content"] == "a\nb");
  CHECK(r.max_tokens == 9);
  CHECK(r.sampling.num_logprobs == 3);
  CHECK(ok(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", ApiKind::chat).sampling.num_logprobs == 0);
  CHECK(ok(R"({"messages": [{"role": "user", "content": "x"}]})", ApiKind::chat).sampling.num_logprobs == -1);
}

TEST_CASE("400 matrix: each deterministic input error names its parameter") {
  struct Case {
    const char* body;
    ApiKind kind;
    const char* param;  // expected OpenAI `param`, "" for none
  };
  const ApiKind C = ApiKind::completion, H = ApiKind::chat;
  const Case cases[] = {
      {R"({"prompt": "x")", C, ""},                       // truncated JSON
      {R"(not json)", C, ""},
      {R"()", C, ""},
      {R"([1, 2])", C, ""},                                // not an object
      {R"("prompt")", C, ""},
      {R"({})", C, "prompt"},
      {R"({"prompt": ""})", C, "prompt"},
      {R"({"prompt": []})", C, "prompt"},
      {R"({"prompt": [""]})", C, "prompt"},
      {R"({"prompt": [[]]})", C, "prompt"},
      {R"({"prompt": 5})", C, "prompt"},
      {R"({"prompt": {"a": 1}})", C, "prompt"},
      {R"({"prompt": [1, "a"]})", C, "prompt"},
      {R"({"prompt": [-1]})", C, "prompt"},
      {R"({"prompt": [1.5]})", C, "prompt"},
      {R"({"prompt": [99999999999]})", C, "prompt"},
      {R"({"prompt": [true]})", C, "prompt"},
      {R"({"prompt": "x", "max_tokens": 0})", C, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": -5})", C, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": "10"})", C, "max_tokens"},
      {R"({"prompt": "x", "max_tokens": 1.5})", C, "max_tokens"},
      {R"({"prompt": "x", "temperature": -0.1})", C, "temperature"},
      {R"({"prompt": "x", "temperature": 2.5})", C, "temperature"},
      {R"({"prompt": "x", "temperature": "hot"})", C, "temperature"},
      {R"({"prompt": "x", "top_p": 0})", C, "top_p"},
      {R"({"prompt": "x", "top_p": 1.01})", C, "top_p"},
      {R"({"prompt": "x", "top_k": -2})", C, "top_k"},
      {R"({"prompt": "x", "min_p": 1.5})", C, "min_p"},
      {R"({"prompt": "x", "presence_penalty": 3})", C, "presence_penalty"},
      {R"({"prompt": "x", "frequency_penalty": -3})", C, "frequency_penalty"},
      {R"({"prompt": "x", "repetition_penalty": 0})", C, "repetition_penalty"},
      {R"({"prompt": "x", "n": 0})", C, "n"},
      {R"({"prompt": "x", "n": 1000000})", C, "n"},
      {R"({"prompt": "x", "logprobs": 21})", C, "logprobs"},
      {R"({"prompt": "x", "logprobs": true})", C, "logprobs"},
      {R"({"prompt": "x", "stop": 5})", C, "stop"},
      {R"({"prompt": "x", "stop": [""]})", C, "stop"},
      {R"({"prompt": "x", "stop": ["a", 1]})", C, "stop"},
      {R"({"prompt": "x", "stream": "yes"})", C, "stream"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", C, "stream_options"},
      {R"({"prompt": "x", "stream": true, "stream_options": 3})", C, "stream_options"},
      {R"({"prompt": "x", "prompt_logprobs": 21})", C, "prompt_logprobs"},
      {R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})", C, "prompt_logprobs"},
      {R"({"prompt": "x", "max_tokens": 3, "min_tokens": 4})", C, "min_tokens"},
      {R"({"prompt": "x", "min_tokens": -1})", C, "min_tokens"},
      {R"({"prompt": "x", "seed": 1.5})", C, "seed"},
      {R"({"prompt": "x", "suffix": "tail"})", C, "suffix"},
      {R"({"prompt": "x", "temprature": 0})", C, "temprature"},  // a typo is not silently ignored
      {R"({"prompt": "x", "logit_bias": {"abc": 1}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1.5": 1}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"-1": 1}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"": 1}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": "5"}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": true}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": 100.5}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"1": -101}})", C, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": [1]})", C, "logit_bias"},
      {R"({"prompt": "x", "best_of": 1.5})", C, "best_of"},
      {R"({"prompt": "x", "best_of": "2"})", C, "best_of"},
      {R"({"prompt": "x", "n": 3, "best_of": 2})", C, "best_of"},
      {R"({"prompt": "x", "best_of": 0})", C, "best_of"},
      {R"({"prompt": "x", "best_of": 17})", C, "best_of"},
      {R"({"prompt": "x", "best_of": 2, "stream": true})", C, "best_of"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": true, "x": 1}})", C, "stream_options"},
      {R"({"prompt": "x", "response_format": {"type": "xml"}})", C, "response_format.type"},
      {R"({"prompt": "x", "response_format": {}})", C, "response_format.type"},
      {R"({"prompt": "x", "response_format": "json"})", C, "response_format"},
      {R"({"prompt": "x", "allowed_token_ids": []})", C, "allowed_token_ids"},
      {R"({"prompt": "x", "truncate_prompt_tokens": 0})", C, "truncate_prompt_tokens"},
      {R"({"prompt": "x", "max_completion_tokens": 5})", C, "max_completion_tokens"},  // a chat field
      {R"({"prompt": "x", "model": 3})", C, "model"},
      {R"({"prompt": "x", "user": 3})", C, "user"},
      {R"({"prompt": "x", "ignore_eos": 1})", C, "ignore_eos"},
      {R"({"prompt": "x", "stop_token_ids": [-1]})", C, "stop_token_ids"},
      {R"({})", H, "messages"},
      {R"({"messages": []})", H, "messages"},
      {R"({"messages": "hi"})", H, "messages"},
      {R"({"messages": [1]})", H, "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", H, "messages[0].role"},
      {R"({"messages": [{"role": 5, "content": "x"}]})", H, "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", H, "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", H,
       "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", H, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})", H, "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})", H, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})", H, "max_completion_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", H, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", H, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "f"}}})", H,
       "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}], "tool_choice": "none"})", H,
       "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", H, "echo"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "x"})", H, "prompt"},  // a completions field
      {R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true, "add_generation_prompt": true})",
       H, "continue_final_message"},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const ApiError e = bad(c.body, c.kind);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == c.param);
    CHECK_FALSE(e.message.empty());
  }
}

TEST_CASE("hostile JSON: deep nesting, invalid UTF-8, lone surrogates, huge stop lists") {
  std::string deep = R"({"prompt": "x", "a": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(bad(deep).message.find("nesting") != std::string::npos);
  CHECK(bad("{\"prompt\": \"\xff\xfe\"}").status == 400);           // invalid UTF-8
  CHECK(bad(R"({"prompt": "\ud800"})").status == 400);               // lone high surrogate
  CHECK(bad(R"({"prompt": "\udc00 x"})").status == 400);             // lone low surrogate
  CHECK(bad(std::string("{\"prompt\": \"a\0b\"}", 17)).status == 400);  // raw NUL inside a string
  CHECK(*ok(R"({"prompt": "a\u0000b"})").prompts[0].text == std::string("a\0b", 3));  // escaped NUL is text
  std::string stops = R"({"prompt": "x", "stop": [)";
  for (int i = 0; i < 1000; ++i) stops += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  CHECK(bad(stops + "]}").param == "stop");
  CHECK(bad(R"({"prompt": "x", "stop": [")" + std::string(10000, 'a') + "\"]}").param == "stop");
}

TEST_CASE("logit_bias: string token ids to biases in [-100, 100]; duplicates of one id, the last wins") {
  auto r = ok(R"({"prompt": "x", "logit_bias": {"50256": -100, "7": 2.5, "007": 1, "0": 100}})");
  CHECK(r.sampling.logit_bias == std::vector<std::pair<int32_t, float>>{{0, 100.0f}, {7, 1.0f}, {50256, -100.0f}});
  CHECK(ok(R"({"prompt": "x", "logit_bias": {}})").sampling.logit_bias.empty());
  CHECK(ok(R"({"prompt": "x", "logit_bias": null})").sampling.logit_bias.empty());
  std::string many = R"({"prompt": "x", "logit_bias": {)";
  for (int i = 0; i < 1025; ++i) many += std::string(i ? "," : "") + "\"" + std::to_string(i) + "\": 1";
  CHECK(bad(many + "}}").param == "logit_bias");
}

TEST_CASE("best_of: at least n, at most 16, never streamed when larger than n") {
  CHECK(ok(R"({"prompt": "x"})").best_of == 1);
  CHECK(ok(R"({"prompt": "x", "n": 3})").best_of == 3);
  auto r = ok(R"({"prompt": "x", "n": 2, "best_of": 5})");
  CHECK((r.n == 2 && r.best_of == 5));
  CHECK(ok(R"({"prompt": "x", "n": 2, "best_of": 2, "stream": true})").best_of == 2);
  CHECK(ok(R"({"messages": [{"role": "user", "content": "x"}], "best_of": 3})", ApiKind::chat).best_of == 3);
  CHECK(bad(R"({"prompt": "x", "n": 3, "best_of": 2})").message.find("at least 'n' (3)") != std::string::npos);
}

TEST_CASE("unknown fields get a 400 naming them; structured output and tool fields land in the request") {
  const ApiError e = bad(R"({"prompt": "x", "max_token": 5})");
  CHECK(e.code == "unknown_parameter");
  CHECK(e.message.rfind("Unknown parameter: 'max_token'.", 0) == 0);
  // Their shape is checked here; schemas and tool names are compiled and checked by the front
  // end (tests/unit/api/test_structured_api.cpp).
  const auto chat = [](const std::string& extra) {
    return ok(R"({"messages": [{"role": "user", "content": "x"}], )" + extra + "}", ApiKind::chat);
  };
  CHECK(chat(R"("response_format": {"type": "json_object"})").response_format["type"] == "json_object");
  CHECK(ok(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}})")
            .response_format["type"] == "json_schema");
  const ApiRequest tools = chat(R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                                   "parallel_tool_calls": false)");
  CHECK(tools.tools.size() == 1);
  CHECK(tools.tool_choice == "required");
  CHECK_FALSE(tools.parallel_tool_calls);
  CHECK(chat(R"("tool_choice": "auto")").tools.is_null());
  CHECK(bad(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "structural_tag"}})", ApiKind::chat).code ==
        "unsupported_parameter");
  CHECK(chat(R"("parallel_tool_calls": false, "store": false, "metadata": {"a": "b"}, "user": "u")").messages.size() == 1);
}

TEST_CASE("vLLM's extensions that are implemented land in the request") {
  auto r = ok(R"({"prompt": "x", "include_stop_str_in_output": true, "truncate_prompt_tokens": 3, "allowed_token_ids": [4, 5],
                  "add_special_tokens": false, "return_tokens_as_token_ids": true, "spaces_between_special_tokens": false,
                  "min_tokens": 0, "priority": 0, "use_beam_search": false, "length_penalty": 1.0})");
  CHECK(r.include_stop_str_in_output);
  CHECK(r.truncate_prompt_tokens == 3);
  CHECK(r.sampling.allowed_token_ids == std::vector<int32_t>{4, 5});
  CHECK(r.add_special_tokens == false);
  CHECK(r.return_tokens_as_token_ids);
  auto scoring = ok(R"({"prompt": "x", "echo": true, "logprobs": 2, "max_tokens": 0, "min_tokens": 0, "prompt_logprobs": 3})");
  CHECK(scoring.echo);
  CHECK(scoring.max_tokens == 0);  // with echo: the prompt is scored, nothing generated
  CHECK(scoring.sampling.num_logprobs == 2);
  CHECK(scoring.prompt_logprobs == 3);
  CHECK(ok(R"({"prompt": "x", "max_tokens": 6, "min_tokens": 6})").sampling.min_tokens == 6);
  CHECK(ok(R"({"messages": [{"role": "user", "content": "x"}], "prompt_logprobs": 0})", ApiKind::chat).prompt_logprobs == 0);
  auto c = ok(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                  "continue_final_message": true, "documents": [{"title": "t", "text": "d"}]})",
              ApiKind::chat);
  CHECK(c.continue_final_message);
  CHECK_FALSE(c.add_generation_prompt);  // continuing the last message: no new turn
  CHECK(c.documents.size() == 1);
  CHECK_FALSE(c.add_special_tokens.has_value());
}

TEST_CASE("--ignore-request-fields: the named unknown fields are accepted and ignored, no others; known ones cannot be named") {
  ApiLimits limits;
  limits.ignored_fields = {"no_stop_trim", "rid"};
  const std::string body = R"({"prompt": "x", "max_tokens": 3, "no_stop_trim": true, "rid": {"any": ["value"]}})";
  for (const ApiKind kind : {ApiKind::completion, ApiKind::chat}) {
    const std::string b = kind == ApiKind::chat ? R"({"messages": [{"role": "user", "content": "x"}], "no_stop_trim": 1})" : body;
    auto accepted = parse_api_request(b, kind, limits);
    REQUIRE(std::holds_alternative<ApiRequest>(accepted));
    auto refused = parse_api_request(b, kind);  // the default: OpenAI's rule
    REQUIRE(std::holds_alternative<ApiError>(refused));
    CHECK(std::get<ApiError>(refused).code == "unknown_parameter");
    CHECK(std::get<ApiError>(refused).message.find("--ignore-request-fields") != std::string::npos);
  }
  CHECK(std::get<ApiRequest>(parse_api_request(body, ApiKind::completion, limits)).max_tokens == 3);
  // Another unknown field is still a 400.
  auto other = parse_api_request(R"({"prompt": "x", "no_stop_trim": true, "max_token": 5})", ApiKind::completion, limits);
  REQUIRE(std::holds_alternative<ApiError>(other));
  CHECK(std::get<ApiError>(other).param == "max_token");
  // A field of the table has its own rule: it cannot be ignored instead.
  CHECK(why_not_ignorable("no_stop_trim").empty());
  CHECK(why_not_ignorable("temperature").find("supported") != std::string::npos);
  CHECK(why_not_ignorable("use_beam_search").find("rejected") != std::string::npos);
}
