// Structured outputs and tools through ApiFrontend::handle (no sockets): response_format and
// tool_choice become a compiled grammar on the engine request (cached across requests); every
// bad or unsupported input is a 400 naming the parameter and keyword; tools reach the prompt
// through the template (Qwen3) or a system message (SmolLM2's template ignores tools); and the
// ResponseBuilder turns the model's calls into message.tool_calls and streaming deltas.
#include <catch2/catch.hpp>

#include "fake_engine.hpp"
#include "server/api/frontend.hpp"
#include "server/grammar/token_vocab.hpp"
#include "tests/unit/chat_template/fixture_util.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

struct Api {
  explicit Api(const std::string& template_name) : frontend(FrontendOptions{}, metrics) {
    tokenizer = load_tokenizer_dir(FP8SERVE_FIXTURES_DIR "/models/tiny-qwen3");
    const std::string source = test::read_fixture_file(FP8SERVE_FIXTURES_DIR "/chat_templates/" + template_name + ".jinja");
    chat_template = std::make_unique<ChatTemplate>(ChatTemplate::parse(source));
    structured = std::make_unique<StructuredOutputs>(
        grammar::TokenVocabulary::from_tokenizer(*tokenizer, tokenizer->vocab_size(), {*tokenizer->eos_id()}));
    ModelContext m;
    m.served_model_name = "tiny";
    m.max_model_len = 4096;
    m.max_num_seqs = 4;
    m.tokenizer = tokenizer.get();
    m.chat_template = chat_template.get();
    m.template_extras = {{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}};
    m.engine = &engine;
    m.structured = structured.get();
    m.tool_support = tool_template_support(source, std::nullopt);
    frontend.set_ready(std::move(m));
  }
  RouteResult post(const std::string& target, const Json& body) {
    return frontend.handle({"POST", target, "", "application/json", body.dump(), "rid"});
  }
  HttpReply error(const std::string& target, const Json& body) {
    auto r = post(target, body);
    REQUIRE(std::holds_alternative<HttpReply>(r));
    return std::get<HttpReply>(r);
  }
  GenerationJob job(const std::string& target, const Json& body) {
    auto r = post(target, body);
    if (auto* reply = std::get_if<HttpReply>(&r)) FAIL("expected a job, got " << reply->status << " " << reply->body);
    GenerationJob j = std::move(std::get<GenerationJob>(r));
    frontend.release(j.num_seqs);
    return j;
  }
  std::string prompt_of(const Json& body) {
    auto r = post("/tokenize", body);
    REQUIRE(std::holds_alternative<HttpReply>(r));
    const HttpReply& reply = std::get<HttpReply>(r);
    INFO(reply.body);
    REQUIRE(reply.status == 200);
    return tokenizer->decode(Json::parse(reply.body)["tokens"].get<std::vector<int32_t>>(), false);
  }

  ServerMetrics metrics;
  ApiFrontend frontend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<StructuredOutputs> structured;
  test::FakeEngine engine;
};

const Json kMessages = Json::array({{{"role", "user"}, {"content", "What is the weather in Paris?"}}});
const Json kTools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])");
const Json kSchema = Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");

}  // namespace

TEST_CASE("response_format: a grammar on the request, compiled once, on both endpoints") {
  Api api("qwen3");
  const Json format = {{"type", "json_schema"}, {"json_schema", {{"name", "a"}, {"schema", kSchema}, {"strict", true}}}};
  GenerationJob chat = api.job("/v1/chat/completions", {{"messages", kMessages}, {"response_format", format}});
  REQUIRE(chat.requests[0].grammar != nullptr);
  GenerationJob again = api.job("/v1/completions", {{"prompt", "x"}, {"response_format", format}, {"n", 2}});
  CHECK(again.requests[0].grammar == chat.requests[0].grammar);  // the cache's compiled grammar
  CHECK(api.structured->num_cached() == 1);
  GenerationJob object = api.job("/v1/chat/completions", {{"messages", kMessages}, {"response_format", {{"type", "json_object"}}}});
  CHECK(object.requests[0].grammar != nullptr);
  GenerationJob text = api.job("/v1/chat/completions", {{"messages", kMessages}, {"response_format", {{"type", "text"}}}});
  CHECK(text.requests[0].grammar == nullptr);
}

TEST_CASE("response_format: bad and unsupported input is a 400 naming what is wrong") {
  Api api("qwen3");
  auto check = [&](const Json& format, const std::string& needle) {
    const HttpReply reply = api.error("/v1/chat/completions", {{"messages", kMessages}, {"response_format", format}});
    INFO(reply.body);
    CHECK(reply.status == 400);
    const Json e = Json::parse(reply.body)["error"];
    // An unknown type names response_format.type (the request-field table's rule); the rest response_format.
    CHECK(e["param"] == (format.value("type", "") == "regex" ? "response_format.type" : "response_format"));
    CHECK(e["message"].get<std::string>().find(needle) != std::string::npos);
  };
  check({{"type", "regex"}}, "json_schema");
  check({{"type", "json_schema"}}, "json_schema");
  check({{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}, "schema");
  check({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "integer"}, {"multipleOf", 3}}}}}}, "multipleOf");
  check({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"minLength", 3}, {"maxLength", 1}}}}}},
        "no value satisfies");
  check({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"$ref", "#/$defs/nope"}}}}}}, "$ref");
  check({{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"maxLength", 100000}}}}}}, "maxLength");
}

TEST_CASE("tool_choice: required and named constrain the answer; bad choices are 400s") {
  Api api("qwen3");
  GenerationJob required = api.job("/v1/chat/completions", {{"messages", kMessages}, {"tools", kTools}, {"tool_choice", "required"}});
  CHECK(required.requests[0].grammar != nullptr);
  CHECK(required.builder->meta().tool_parser == ToolCallFormat::hermes);
  GenerationJob named = api.job("/v1/chat/completions", {{"messages", kMessages}, {"tools", kTools},
                                                          {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}}});
  CHECK(named.requests[0].grammar != nullptr);
  CHECK(named.requests[0].grammar != required.requests[0].grammar);
  GenerationJob automatic = api.job("/v1/chat/completions", {{"messages", kMessages}, {"tools", kTools}});
  CHECK(automatic.requests[0].grammar == nullptr);
  CHECK(automatic.builder->meta().tool_parser.has_value());
  GenerationJob none = api.job("/v1/chat/completions", {{"messages", kMessages}, {"tools", kTools}, {"tool_choice", "none"}});
  CHECK_FALSE(none.builder->meta().tool_parser.has_value());

  auto status_param = [&](const Json& body) {
    const HttpReply r = api.error("/v1/chat/completions", body);
    return std::to_string(r.status) + " " + Json::parse(r.body)["error"]["param"].get<std::string>();
  };
  CHECK(status_param({{"messages", kMessages}, {"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}) ==
        "400 tool_choice");
  CHECK(status_param({{"messages", kMessages}, {"tool_choice", "required"}}) == "400 tool_choice");
  CHECK(status_param({{"messages", kMessages}, {"tools", kTools}, {"tool_choice", "sometimes"}}) == "400 tool_choice");
  CHECK(status_param({{"messages", kMessages}, {"tools", Json::array({{{"type", "function"}, {"function", {{"name", "bad name"}}}}})}}) ==
        "400 tools[0].function.name");
  CHECK(status_param({{"messages", kMessages}, {"tools", kTools}, {"tool_choice", "required"},
                      {"response_format", {{"type", "json_object"}}}}) == "400 response_format");
  Json hostile = kTools;
  hostile[0]["function"]["parameters"] = {{"type", "object"}, {"properties", {{"x", {{"not", {{"type", "string"}}}}}}}};
  CHECK(status_param({{"messages", kMessages}, {"tools", hostile}, {"tool_choice", "required"}}) == "400 tools");
}

TEST_CASE("tools reach the prompt: through the template, or a system message when it ignores them") {
  Api qwen("qwen3");
  const std::string q = qwen.prompt_of({{"messages", kMessages}, {"tools", kTools}});
  CHECK(q.find("# Tools") != std::string::npos);  // Qwen's own tool section
  CHECK(q.find("get_weather") != std::string::npos);

  Api smol("smollm2");
  const std::string plain = smol.prompt_of({{"messages", kMessages}});
  CHECK(plain.find("<tools>") == std::string::npos);
  const std::string with_tools = smol.prompt_of({{"messages", kMessages}, {"tools", kTools}});
  CHECK(with_tools.find("<tools>") != std::string::npos);
  CHECK(with_tools.find("\"get_weather\"") != std::string::npos);
  CHECK(with_tools.find("<tool_call>") != std::string::npos);
  // A past call and its result, written as text the model can read.
  Json history = kMessages;
  history.push_back({{"role", "assistant"}, {"content", nullptr},
                     {"tool_calls", Json::array({{{"id", "call_1"}, {"type", "function"},
                                                  {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}})}});
  history.push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C, sunny"}});
  const std::string turn = smol.prompt_of({{"messages", history}, {"tools", kTools}});
  CHECK(turn.find("{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}") != std::string::npos);
  CHECK(turn.find("<tool_response>\n18 C, sunny\n</tool_response>") != std::string::npos);
  const std::string qturn = qwen.prompt_of({{"messages", history}, {"tools", kTools}});
  CHECK(qturn.find("\"arguments\": {\"city\": \"Paris\"}") != std::string::npos);  // Qwen prints the object
  CHECK(qturn.find("<tool_response>\n18 C, sunny\n</tool_response>") != std::string::npos);
}

TEST_CASE("responses: calls become message.tool_calls and streamed deltas, finish_reason tool_calls") {
  const std::string text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  auto run = [&](bool stream) {
    ResponseMeta meta;
    meta.kind = ApiKind::chat;
    meta.id = "chatcmpl-1";
    meta.stream = stream;
    meta.tool_parser = ToolCallFormat::hermes;
    ResponseBuilder b(meta, [](int32_t) { return std::string(); });
    std::vector<std::string> events;
    for (size_t i = 0; i < text.size(); i += 5) {
      RequestOutput out;
      out.text_delta = text.substr(i, 5);
      if (i + 5 >= text.size()) out.finish = FinishReason::stop;
      for (auto& e : b.on_output(0, out)) events.push_back(e);
    }
    return std::make_pair(b.final_body(), events);
  };
  const Json body = run(false).first;
  const Json& choice = body["choices"][0];
  CHECK(choice["finish_reason"] == "tool_calls");
  CHECK(choice["message"]["content"] == "Sure.");
  REQUIRE(choice["message"]["tool_calls"].size() == 1);
  const Json& call = choice["message"]["tool_calls"][0];
  CHECK(call["function"]["name"] == "get_weather");
  CHECK(Json::parse(call["function"]["arguments"].get<std::string>()) == Json{{"city", "Paris"}});

  std::string content, arguments, name, id, finish;
  for (const std::string& e : run(true).second) {
    const Json chunk = Json::parse(e.substr(6));
    const Json& c = chunk["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls"))
      for (const Json& d : c["delta"]["tool_calls"]) {
        if (d.contains("id")) id = d["id"], name = d["function"]["name"];
        arguments += d["function"]["arguments"].get<std::string>();
      }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  CHECK(content == "Sure.\n");
  CHECK(name == "get_weather");
  CHECK(id == call["id"]);
  CHECK(arguments == call["function"]["arguments"]);
  CHECK(finish == "tool_calls");
}
