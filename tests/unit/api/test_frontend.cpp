// ApiFrontend::handle without sockets: routing, auth, content type, health states, admission,
// tokenization through the real tokenizer and chat template (checked against the jinja2
// rendering recorded in the chat-template fixtures), context-length errors.
#include <catch2/catch.hpp>

#include "fake_engine.hpp"
#include "server/api/frontend.hpp"
#include "tests/unit/chat_template/fixture_util.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

struct Fixture {
  Fixture(FrontendOptions options = {}) : frontend(std::move(options), metrics) {
    tokenizer = load_tokenizer_dir(FP8SERVE_FIXTURES_DIR "/models/tiny-qwen3");
    chat_template = std::make_unique<ChatTemplate>(ChatTemplate::parse(test::read_fixture_file(FP8SERVE_FIXTURES_DIR "/chat_templates/qwen3.jinja")));
  }
  void ready(int max_model_len = 64, int max_num_seqs = 4) {
    ModelContext m;
    m.served_model_name = "tiny";
    m.max_model_len = max_model_len;
    m.max_num_seqs = max_num_seqs;
    m.tokenizer = tokenizer.get();
    m.chat_template = chat_template.get();
    m.template_extras = {{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}};
    m.engine = &engine;
    frontend.set_ready(std::move(m));
  }
  RouteResult call(const std::string& method, const std::string& target, const std::string& body = "",
                   const std::string& auth = "", const std::string& content_type = "application/json") {
    return frontend.handle({method, target, auth, content_type, body, "rid1"});
  }
  HttpReply reply(const std::string& method, const std::string& target, const std::string& body = "",
                  const std::string& auth = "", const std::string& content_type = "application/json") {
    auto r = call(method, target, body, auth, content_type);
    REQUIRE(std::holds_alternative<HttpReply>(r));
    return std::get<HttpReply>(r);
  }
  GenerationJob job(const std::string& target, const std::string& body) {
    auto r = call("POST", target, body);
    if (auto* reply = std::get_if<HttpReply>(&r)) FAIL("expected a job, got " << reply->status << " " << reply->body);
    return std::move(std::get<GenerationJob>(r));
  }

  ServerMetrics metrics;
  ApiFrontend frontend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  test::FakeEngine engine;
};

Json error_of(const HttpReply& r) { return Json::parse(r.body)["error"]; }

}  // namespace

TEST_CASE("health: 503 while loading, 200 when ready, 503 when draining") {
  Fixture f;
  CHECK(f.reply("GET", "/health").status == 503);
  CHECK(f.reply("POST", "/v1/completions", R"({"prompt": "x"})").status == 503);
  f.ready();
  CHECK(f.reply("GET", "/health").status == 200);
  f.frontend.set_draining();
  CHECK(f.reply("GET", "/health").status == 503);
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": "x"})");
  CHECK(r.status == 503);
  CHECK(r.headers.size() == 1);
  CHECK(r.headers[0].first == "Retry-After");
}

TEST_CASE("routing: 404, 405 with Allow, 415, models list") {
  Fixture f;
  f.ready();
  HttpReply r = f.reply("GET", "/v2/nothing");
  CHECK(r.status == 404);
  CHECK(error_of(r)["type"] == "invalid_request_error");
  r = f.reply("GET", "/v1/completions");
  CHECK(r.status == 405);
  CHECK(r.headers.at(0) == std::pair<std::string, std::string>("Allow", "POST"));
  CHECK(f.reply("DELETE", "/v1/models").status == 405);
  CHECK(f.reply("POST", "/v1/completions", R"({"prompt": "x"})", "", "text/plain").status == 415);
  CHECK(f.reply("POST", "/v1/completions", R"({"prompt": "x"})", "", "").status == 415);
  CHECK(std::holds_alternative<GenerationJob>(f.call("POST", "/v1/completions?x=1", R"({"prompt": "x"})", "",
                                                      "Application/JSON; charset=utf-8")));
  Json models = Json::parse(f.reply("GET", "/v1/models").body);
  CHECK(models["object"] == "list");
  CHECK(models["data"][0]["id"] == "tiny");
  CHECK(f.reply("POST", "/v1/completions", R"({"model": "other", "prompt": "x"})").status == 404);
  CHECK(error_of(f.reply("POST", "/v1/completions", R"({"model": "other", "prompt": "x"})"))["code"] == "model_not_found");
}

TEST_CASE("reset_prefix_cache: POST, no body needed, behind the key, once per call") {
  FrontendOptions options;
  options.api_key = "sekrit";
  Fixture f(options);
  CHECK(f.reply("POST", "/reset_prefix_cache", "", "Bearer sekrit", "").status == 503);  // loading
  f.ready();
  CHECK(f.reply("POST", "/reset_prefix_cache", "", "", "").status == 401);
  CHECK(f.reply("GET", "/reset_prefix_cache", "", "Bearer sekrit").status == 405);
  CHECK(f.engine.resets == 0);
  CHECK(f.reply("POST", "/reset_prefix_cache", "", "Bearer sekrit", "").status == 200);
  CHECK(f.engine.resets == 1);
}

TEST_CASE("api key: every route but /health; /metrics only with --metrics-public") {
  FrontendOptions options;
  options.api_key = "sekrit";
  Fixture f(options);
  f.ready();
  CHECK(f.reply("GET", "/health").status == 200);
  CHECK(f.reply("GET", "/v1/models").status == 401);
  CHECK(f.reply("GET", "/v1/models", "", "Bearer wrong").status == 401);
  CHECK(f.reply("GET", "/v1/models", "", "Bearer sekri").status == 401);
  CHECK(f.reply("GET", "/v1/models", "", "sekrit").status == 401);
  CHECK(f.reply("GET", "/v1/models", "", "Bearer ").status == 401);
  CHECK(error_of(f.reply("GET", "/metrics"))["code"] == "invalid_api_key");
  CHECK(f.reply("GET", "/v1/models", "", "Bearer sekrit").status == 200);
  CHECK(f.reply("GET", "/metrics", "", "Bearer sekrit").status == 200);
  options.metrics_public = true;
  Fixture g(options);
  g.ready();
  CHECK(g.reply("GET", "/metrics").status == 200);
  CHECK(g.reply("POST", "/tokenize", R"({"prompt": "x"})").status == 401);
}

TEST_CASE("completions: prompts are tokenized with special tokens; n and ids carried over") {
  Fixture f;
  f.ready();
  GenerationJob job = f.job("/v1/completions", R"({"prompt": ["Hello world", "Bye"], "n": 2, "max_tokens": 3,
                                                   "stop": ["x"], "seed": 5, "temperature": 0})");
  REQUIRE(job.requests.size() == 2);
  CHECK(job.num_seqs == 4);
  CHECK(job.requests[0].prompt_tokens == f.tokenizer->encode("Hello world", true));
  CHECK(job.requests[1].prompt_tokens == f.tokenizer->encode("Bye", true));
  CHECK(job.requests[0].request_id == "rid1-0");
  CHECK(job.requests[1].n == 2);
  CHECK(job.requests[1].max_tokens == 3);
  CHECK(job.requests[1].stop == std::vector<std::string>{"x"});
  CHECK(job.requests[1].sampling.seed == 5u);
  CHECK(job.builder->meta().id == "cmpl-rid1");
  CHECK(f.frontend.in_flight_seqs() == 4);
  f.frontend.release(job.num_seqs);
  CHECK(f.frontend.in_flight_seqs() == 0);
  // The default completion length is OpenAI's 16.
  GenerationJob one = f.job("/v1/completions", R"({"prompt": [1, 2, 3]})");
  CHECK(one.requests[0].max_tokens == 16);
  CHECK(one.requests[0].prompt_tokens == std::vector<int32_t>{1, 2, 3});
  CHECK(one.requests[0].request_id == "rid1");
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": [1, 512]})");
  CHECK(r.status == 400);
  CHECK(error_of(r)["param"] == "prompt");
}

TEST_CASE("chat: the prompt is the template's rendering, as jinja2 renders it") {
  Fixture f;
  f.ready(/*max_model_len=*/512);
  const Json cases = Json::parse(test::read_fixture_file(FP8SERVE_FIXTURES_DIR "/chat_templates/qwen3.cases.json"));
  const Json& c = cases["cases"][0];  // single user message, generation prompt
  REQUIRE(c["extra"]["eos_token"] == "<|im_end|>");
  Json body = {{"messages", c["messages"]}, {"add_generation_prompt", c["add_generation_prompt"]}};
  GenerationJob job = f.job("/v1/chat/completions", body.dump());
  REQUIRE(job.requests.size() == 1);
  CHECK(job.requests[0].prompt_tokens == f.tokenizer->encode(c["expected"].get<std::string>(), false));
  // No max_tokens: the rest of the context (vLLM's default for chat).
  CHECK(job.requests[0].max_tokens == 512 - static_cast<int>(job.requests[0].prompt_tokens.size()));
  CHECK(job.builder->meta().id == "chatcmpl-rid1");
  // /tokenize with messages gives the same ids.
  Json t = Json::parse(f.reply("POST", "/tokenize", body.dump()).body);
  CHECK(t["tokens"].get<std::vector<int32_t>>() == job.requests[0].prompt_tokens);
  CHECK(t["count"] == job.requests[0].prompt_tokens.size());
  CHECK(t["max_model_len"] == 512);
}

TEST_CASE("context length: the OpenAI message with code context_length_exceeded") {
  Fixture f;
  f.ready(/*max_model_len=*/8);
  const auto ids = f.tokenizer->encode("one two three", true);
  REQUIRE(ids.size() < 8);
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": "one two three", "max_tokens": 100})");
  CHECK(r.status == 400);
  const Json e = error_of(r);
  CHECK(e["code"] == "context_length_exceeded");
  CHECK(e["message"].get<std::string>().rfind("This model's maximum context length is 8 tokens. However, you requested " +
                                                  std::to_string(ids.size() + 100) + " tokens (" + std::to_string(ids.size()) +
                                                  " in the prompt, 100 in the completion).",
                                              0) == 0);
  // Default 16 does not fit either.
  CHECK(f.reply("POST", "/v1/completions", R"({"prompt": "one two three"})").status == 400);
  CHECK(std::holds_alternative<GenerationJob>(f.call("POST", "/v1/completions", R"({"prompt": "one", "max_tokens": 2})")));
}

TEST_CASE("tokenize / detokenize round trip") {
  Fixture f;
  f.ready();
  Json t = Json::parse(f.reply("POST", "/tokenize", R"({"prompt": "Hello world", "add_special_tokens": false})").body);
  CHECK(t["tokens"].get<std::vector<int32_t>>() == f.tokenizer->encode("Hello world", false));
  Json d = Json::parse(f.reply("POST", "/detokenize", Json{{"tokens", t["tokens"]}}.dump()).body);
  CHECK(d["prompt"] == "Hello world");
  CHECK(f.reply("POST", "/detokenize", R"({"tokens": [100000]})").status == 400);
  CHECK(f.reply("POST", "/detokenize", R"({"tokens": "x"})").status == 400);
  CHECK(f.reply("POST", "/tokenize", R"({"prompt": 5})").status == 400);
  CHECK(f.reply("POST", "/tokenize", R"({"messages": []})").status == 400);
}

TEST_CASE("admission: beyond max_num_seqs + max_waiting_requests the answer is 503 with Retry-After") {
  FrontendOptions options;
  options.max_waiting_requests = 1;
  Fixture f(options);
  f.ready(64, /*max_num_seqs=*/2);
  CHECK(f.reply("POST", "/v1/completions", R"({"prompt": "a", "n": 3})").status == 400);  // n > max_num_seqs
  GenerationJob a = f.job("/v1/completions", R"({"prompt": "a", "n": 2})");  // 2 run
  GenerationJob b = f.job("/v1/completions", R"({"prompt": "a"})");          // 1 waits
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": "b"})");
  CHECK(r.status == 503);
  CHECK(r.headers.at(0).first == "Retry-After");
  CHECK(f.frontend.in_flight_seqs() == 3);
  f.frontend.release(a.num_seqs);
  f.frontend.release(b.num_seqs);
  CHECK(std::holds_alternative<GenerationJob>(f.call("POST", "/v1/completions", R"({"prompt": "b"})")));
}

TEST_CASE("admission: a request that can never fit is a 400 naming the limits, not a 503 forever") {
  FrontendOptions options;
  options.max_waiting_requests = 2;
  Fixture f(options);
  f.ready(64, /*max_num_seqs=*/2);
  // 8 prompts on an idle server with room for 2 running + 2 waiting.
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": ["a", "b", "c", "d", "e", "f", "g", "h"]})");
  CHECK(r.status == 400);
  CHECK(r.headers.empty());  // no Retry-After: retrying cannot help
  const Json e = error_of(r);
  CHECK(e["code"] == "request_too_large");
  CHECK(e["param"] == "prompt");
  const std::string message = e["message"];
  CHECK(message.find("needs 8 sequences") != std::string::npos);
  CHECK(message.find("--max-num-seqs 2") != std::string::npos);
  CHECK(message.find("--max-waiting-requests 2") != std::string::npos);
  CHECK(f.frontend.in_flight_seqs() == 0);
  // 4 fit exactly, on an idle server.
  GenerationJob four = f.job("/v1/completions", R"({"prompt": ["a", "b", "c", "d"]})");
  CHECK(four.num_seqs == 4);
  // Now full: the next one can fit later, so it is a 503 with Retry-After.
  HttpReply busy = f.reply("POST", "/v1/completions", R"({"prompt": "a"})");
  CHECK(busy.status == 503);
  CHECK(busy.headers.at(0).first == "Retry-After");
  f.frontend.release(four.num_seqs);
  // The default limits: 64 prompts x n = 16 is 1024 sequences > 64 + 256.
  Fixture g;
  g.ready(64, /*max_num_seqs=*/64);
  Json prompts = Json::array();
  for (int i = 0; i < 64; ++i) prompts.push_back("p");
  HttpReply big = g.reply("POST", "/v1/completions", Json{{"prompt", prompts}, {"n", 16}, {"max_tokens", 1}}.dump());
  CHECK(big.status == 400);
  CHECK(error_of(big)["param"] == "n");
}

TEST_CASE("GET /v1/models/{id}: the model card, 404 in the error shape for another id") {
  Fixture f;
  f.ready();
  HttpReply r = f.reply("GET", "/v1/models/tiny");
  CHECK(r.status == 200);
  const Json card = Json::parse(r.body);
  CHECK(card["id"] == "tiny");
  CHECK(card["object"] == "model");
  CHECK(card == Json::parse(f.reply("GET", "/v1/models").body)["data"][0]);
  CHECK(f.reply("GET", "/v1/models/ti%6Ey").status == 200);  // percent-encoded by a client
  HttpReply missing = f.reply("GET", "/v1/models/gpt-4");
  CHECK(missing.status == 404);
  CHECK(error_of(missing)["code"] == "model_not_found");
  CHECK(f.reply("POST", "/v1/models/tiny").status == 405);
}

TEST_CASE("HEAD: GET routes answer as GET (the HTTP layer drops the body), other routes 405 naming their methods") {
  Fixture f;
  f.ready();
  for (const char* path : {"/health", "/v1/models", "/v1/models/tiny", "/metrics"}) {
    INFO(path);
    const HttpReply get = f.reply("GET", path);
    const HttpReply head = f.reply("HEAD", path);
    CHECK(head.status == 200);
    CHECK(head.content_type == get.content_type);
  }
  HttpReply r = f.reply("HEAD", "/v1/completions");
  CHECK(r.status == 405);
  CHECK(r.headers.at(0) == std::pair<std::string, std::string>("Allow", "POST"));
  r = f.reply("DELETE", "/health");
  CHECK(r.status == 405);
  CHECK(r.headers.at(0) == std::pair<std::string, std::string>("Allow", "GET, HEAD"));
  CHECK(f.reply("HEAD", "/nothing").status == 404);
}

TEST_CASE("token ids of logit_bias, allowed_token_ids and stop_token_ids must be in the vocabulary") {
  Fixture f;
  f.ready();
  const int vocab = f.tokenizer->vocab_size();
  for (const char* field : {"logit_bias", "allowed_token_ids", "stop_token_ids"}) {
    INFO(field);
    Json body = {{"prompt", "x"}};
    body[field] = std::string(field) == "logit_bias" ? Json{{std::to_string(vocab), 1}} : Json::array({vocab});
    HttpReply r = f.reply("POST", "/v1/completions", body.dump());
    CHECK(r.status == 400);
    CHECK(error_of(r)["param"] == field);
    CHECK(error_of(r)["message"].get<std::string>().find("out of vocabulary") != std::string::npos);
  }
  GenerationJob job = f.job("/v1/completions", Json{{"prompt", "x"}, {"logit_bias", {{std::to_string(vocab - 1), -5}}},
                                                    {"allowed_token_ids", {0, vocab - 1}}}
                                                   .dump());
  CHECK(job.requests[0].sampling.logit_bias == std::vector<std::pair<int32_t, float>>{{vocab - 1, -5.0f}});
  CHECK(job.requests[0].sampling.allowed_token_ids == std::vector<int32_t>{0, vocab - 1});
}

TEST_CASE("best_of: best_of sequences generated, logprobs computed for ranking, n returned") {
  Fixture f;
  f.ready(64, /*max_num_seqs=*/4);
  GenerationJob job = f.job("/v1/completions", R"({"prompt": "x", "n": 2, "best_of": 4, "max_tokens": 2})");
  CHECK(job.num_seqs == 4);
  CHECK(job.requests[0].n == 4);
  CHECK(job.requests[0].sampling.num_logprobs == 0);  // the chosen tokens' logprobs, to rank by
  CHECK(job.builder->meta().n == 2);
  CHECK(job.builder->meta().best_of == 4);
  CHECK(job.builder->meta().num_logprobs == -1);  // ... but not shown: none were asked for
  f.frontend.release(job.num_seqs);
  HttpReply r = f.reply("POST", "/v1/completions", R"({"prompt": "x", "best_of": 5})");
  CHECK(r.status == 400);
  CHECK(error_of(r)["param"] == "best_of");  // more than --max-num-seqs 4
}

TEST_CASE("prompt options: truncate_prompt_tokens, add_special_tokens, continue_final_message, documents") {
  Fixture f;
  f.ready(/*max_model_len=*/512);
  GenerationJob t = f.job("/v1/completions", R"({"prompt": [1, 2, 3, 4, 5], "truncate_prompt_tokens": 2, "echo": true})");
  CHECK(t.requests[0].prompt_tokens == std::vector<int32_t>{4, 5});
  f.frontend.release(t.num_seqs);
  GenerationJob plain = f.job("/v1/completions", R"({"prompt": "Hello", "add_special_tokens": false})");
  CHECK(plain.requests[0].prompt_tokens == f.tokenizer->encode("Hello", false));
  f.frontend.release(plain.num_seqs);
  // continue_final_message against the transformers rendering recorded in the fixtures.
  const Json cases = Json::parse(test::read_fixture_file(FP8SERVE_FIXTURES_DIR "/chat_templates/qwq_32b.cases.json"));
  size_t checked = 0;
  for (const Json& c : cases["cases"]) {
    if (!c.value("continue_final_message", false) || !c.contains("expected") || c["messages"].back()["content"].is_array())
      continue;
    Json body = {{"messages", c["messages"]}, {"continue_final_message", true}};
    Fixture g;
    g.chat_template = std::make_unique<ChatTemplate>(ChatTemplate::parse(test::read_fixture_file(FP8SERVE_FIXTURES_DIR "/chat_templates/qwq_32b.jinja")));
    g.ready(/*max_model_len=*/4096);
    GenerationJob job = g.job("/v1/chat/completions", body.dump());
    INFO(c["name"]);
    CHECK(job.requests[0].prompt_tokens == g.tokenizer->encode(c["expected"].get<std::string>(), false));
    g.frontend.release(job.num_seqs);
    ++checked;
  }
  CHECK(checked >= 3);
  CHECK(std::holds_alternative<GenerationJob>(
      f.call("POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "documents": [{"title": "t", "text": "d"}]})")));
  // Nothing to continue: a last message without text.
  HttpReply r = f.reply("POST", "/v1/chat/completions",
                        R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}], "continue_final_message": true})");
  CHECK(r.status == 400);
  CHECK(error_of(r)["message"].get<std::string>().find("no content to continue") != std::string::npos);
}

TEST_CASE("/tokenize and /detokenize: unknown fields and another model are refused") {
  Fixture f;
  f.ready();
  HttpReply r = f.reply("POST", "/tokenize", R"({"prompt": "x", "add_special_token": false})");
  CHECK(r.status == 400);
  CHECK(error_of(r)["code"] == "unknown_parameter");
  CHECK(f.reply("POST", "/tokenize", R"({"prompt": "x", "model": "other"})").status == 404);
  CHECK(f.reply("POST", "/tokenize", R"({"prompt": "x", "model": "tiny"})").status == 200);
  CHECK(f.reply("POST", "/detokenize", R"({"tokens": [1], "skip": true})").status == 400);
  CHECK(f.reply("POST", "/detokenize", R"({"tokens": [1], "model": "other"})").status == 404);
  const Json t = Json::parse(
      f.reply("POST", "/tokenize", R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": false}})")
          .body);
  CHECK(t["count"].get<int>() > 0);
}

TEST_CASE("render endpoints: the prompt tokens a generation would run, after the same checks, nothing admitted") {
  Fixture f;
  f.ready();
  // Completions: one object per prompt, each the job's own prompt tokens (text and ids alike).
  const std::string body = R"({"prompt": ["Hello world", "Bye"], "max_tokens": 3, "truncate_prompt_tokens": 1})";
  const HttpReply r = f.reply("POST", "/v1/completions/render", body);
  REQUIRE(r.status == 200);
  const Json rendered = Json::parse(r.body);
  REQUIRE(rendered.is_array());
  REQUIRE(rendered.size() == 2);
  GenerationJob job = f.job("/v1/completions", body);
  for (std::size_t p = 0; p < 2; ++p) {
    CHECK(rendered[p]["token_ids"].get<std::vector<int32_t>>() == job.requests[p].prompt_tokens);
    CHECK(rendered[p]["request_id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(rendered[p]["features"].is_null());
  }
  CHECK(Json::parse(f.reply("POST", "/v1/completions/render", R"({"prompt": [5, 6, 7]})").body)[0]["token_ids"] ==
        Json::array({5, 6, 7}));
  // Chat: one object, the template's rendering tokenized as chat does.
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 2})";
  const HttpReply c = f.reply("POST", "/v1/chat/completions/render", chat);
  REQUIRE(c.status == 200);
  const Json one = Json::parse(c.body);
  REQUIRE(one.is_object());
  CHECK(one["token_ids"].get<std::vector<int32_t>>() == f.job("/v1/chat/completions", chat).requests[0].prompt_tokens);
  CHECK(one["request_id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  // The generation's own errors, in its shape; nothing is admitted.
  CHECK(f.reply("POST", "/v1/completions/render", R"({"prompt": "x", "max_token": 5})").status == 400);
  CHECK(f.reply("POST", "/v1/completions/render", R"({"prompt": "x", "model": "other"})").status == 404);
  CHECK(f.reply("POST", "/v1/completions/render", "{not json").status == 400);
  CHECK(f.reply("POST", "/v1/chat/completions/render", R"({"messages": []})").status == 400);
  CHECK(f.reply("GET", "/v1/completions/render").status == 405);
  const auto in_flight = f.frontend.in_flight_seqs();
  CHECK(f.reply("POST", "/v1/completions/render", R"({"prompt": ["a", "b", "c"]})").status == 200);
  CHECK(f.frontend.in_flight_seqs() == in_flight);  // a render takes no seat
}
