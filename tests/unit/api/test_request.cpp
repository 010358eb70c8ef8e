// Request parsing and validation: the 400 matrix of issue 6 (every deterministic input error
// names its parameter), and the accepted forms of prompt / messages / stop / logprobs.
#include <catch2/catch.hpp>

#include <string>

#include "server/api/request.hpp"

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
                  "ignore_eos": true, "user": "u", "unknown_field": {"ignored": [1, 2]}})");
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
      {R"({"prompt": "x", "echo": true, "logprobs": 1})", C, "echo"},
      {R"({"prompt": "x", "seed": 1.5})", C, "seed"},
      {R"({"prompt": "x", "suffix": "tail"})", C, "suffix"},
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
