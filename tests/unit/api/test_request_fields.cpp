// The table of request fields (server/api/request_features.hpp) against the parser and the
// docs/api.md: every row's accepted example is taken and its refused example gets a 400 naming the
// field; the API table of docs/api.md lists exactly the same fields with the same status.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "server/api/request_features.hpp"
#include "server/api/responses_request.hpp"

using namespace fp8serve;
using Json = nlohmann::ordered_json;

namespace {

// A minimal valid body of the endpoint, with the row's example members merged over it.
std::string body_with(const char* members, ApiKind kind) {
  Json body = kind == ApiKind::chat ? Json{{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}}
                                    : Json{{"prompt", "hi"}};
  const Json extra = Json::parse(std::string("{") + members + "}");
  for (const auto& [key, value] : extra.items()) body[key] = value;
  return body.dump();
}

}  // namespace

TEST_CASE("every field of the table: its accepted example parses, its refused example is a 400 naming it") {
  size_t rows = 0;
  for (const RequestFieldSpec& spec : request_field_specs()) {
    for (const ApiKind kind : {ApiKind::completion, ApiKind::chat}) {
      if ((spec.endpoints & (kind == ApiKind::chat ? kChatField : kCompletionField)) == 0) continue;
      INFO(spec.name << (kind == ApiKind::chat ? " (chat)" : " (completions)"));
      const auto accepted = parse_api_request(body_with(spec.accepted, kind), kind);
      if (const auto* e = std::get_if<ApiError>(&accepted)) FAIL("accepted example refused: " << e->message);
      REQUIRE(spec.refused != nullptr);
      const auto refused = parse_api_request(body_with(spec.refused, kind), kind);
      REQUIRE(std::holds_alternative<ApiError>(refused));
      const ApiError& e = std::get<ApiError>(refused);
      CHECK(e.status == 400);
      CHECK(e.param.rfind(spec.name, 0) == 0);  // "response_format" or "response_format.type"
      if (spec.status == FieldStatus::rejected) CHECK(e.code == "unsupported_parameter");
      ++rows;
    }
  }
  CHECK(rows > 90);
}

TEST_CASE("the table covers OpenAI's and vLLM's request fields, once per endpoint") {
  std::set<std::pair<std::string, unsigned>> seen;
  for (const RequestFieldSpec& spec : request_field_specs()) {
    for (const unsigned e : {unsigned{kCompletionField}, unsigned{kChatField}})
      if (spec.endpoints & e) CHECK(seen.insert({spec.name, e}).second);
  }
  // The fields of openai 3.57's completion_create_params.py and chat/completion_create_params.py.
  for (const char* name : {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
                           "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"})
    CHECK(seen.count({name, kCompletionField}) == 1);
  for (const char* name :
       {"messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning_effort",
        "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
        "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options"})
    CHECK(seen.count({name, kChatField}) == 1);
}

TEST_CASE("the API table of docs/api.md lists every field with the status the server gives it") {
  std::ifstream in(std::string(FP8SERVE_SOURCE_DIR) + "/docs/api.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string page = ss.str();
  const size_t begin = page.find("<!-- api-fields:begin -->");
  const size_t end = page.find("<!-- api-fields:end -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  // | `name` | completions, chat | supported | ...
  const std::regex row(R"(\| `([a-z_]+)` \| ([a-z, ]+) \| (supported|rejected|ignored) \|)");
  std::map<std::pair<std::string, std::string>, std::string> documented;
  const std::string table = page.substr(begin, end - begin);
  for (auto it = std::sregex_iterator(table.begin(), table.end(), row); it != std::sregex_iterator(); ++it)
    CHECK(documented.emplace(std::pair{(*it)[1].str(), (*it)[2].str()}, (*it)[3].str()).second);
  size_t expected = 0;
  for (const RequestFieldSpec& spec : request_field_specs()) {
    const std::string endpoints = spec.endpoints == kBothEndpoints ? "completions, chat"
                                  : spec.endpoints == kChatField   ? "chat"
                                                                   : "completions";
    INFO(spec.name << " (" << endpoints << ")");
    const auto found = documented.find({spec.name, endpoints});
    REQUIRE(found != documented.end());
    CHECK(found->second == field_status_name(spec.status));
    ++expected;
  }
  CHECK(documented.size() == expected);
}

// /v1/responses: the request is checked by its own parser, then by chat's once translated, as the
// front end runs it (frontend_responses.cpp), with the parameter named as the Responses API names it.
namespace {

std::optional<ApiError> responses_check(const char* members) {
  Json body = {{"input", "hi"}};
  const Json extra = Json::parse(std::string("{") + members + "}");
  for (const auto& [key, value] : extra.items()) body[key] = value;
  auto parsed = parse_responses_request(body.dump(), ApiLimits{}, "rid");
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  ResponsesRequest& r = std::get<ResponsesRequest>(parsed);
  r.chat["messages"] = items_to_messages(r.input_items, r.instructions);
  auto chat = parse_api_request(r.chat.dump(), ApiKind::chat);
  if (auto* e = std::get_if<ApiError>(&chat)) return responses_error(*e);
  return std::nullopt;
}

}  // namespace

TEST_CASE("every field of the Responses table: its accepted example runs, its refused example is a 400 naming it") {
  for (const RequestFieldSpec& spec : responses_field_specs()) {
    INFO(spec.name << " (responses)");
    CHECK(spec.endpoints == kResponsesField);
    if (const auto e = responses_check(spec.accepted)) FAIL("accepted example refused: " << e->message);
    const auto e = responses_check(spec.refused);
    REQUIRE(e.has_value());
    CHECK(e->status == 400);
    CHECK(e->param.rfind(spec.name, 0) == 0);
    if (spec.status == FieldStatus::rejected) CHECK(e->code == "unsupported_parameter");
  }
  CHECK(responses_field_specs().size() > 35);
}

TEST_CASE("the Responses table covers openai 3.57's response_create_params, once each") {
  std::set<std::string> seen;
  for (const RequestFieldSpec& spec : responses_field_specs()) CHECK(seen.insert(spec.name).second);
  for (const char* name :
       {"access_programs", "background", "background_options", "context_management", "conversation", "image", "include", "input",
        "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation", "parallel_tool_calls",
        "previous_response_id", "prompt", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning",
        "safety_identifier", "service_tier", "store", "stream", "stream_options", "temperature", "text", "tool_choice", "tools",
        "top_logprobs", "top_p", "truncation", "user"})
    CHECK(seen.count(name) == 1);
  // A field the server knows on any endpoint cannot be ignored by --ignore-request-fields.
  CHECK_FALSE(why_not_ignorable("instructions").empty());
  CHECK(why_not_ignorable("no_stop_trim").empty());
}

TEST_CASE("the Responses table of docs/api.md lists every field with the status the server gives it") {
  std::ifstream in(std::string(FP8SERVE_SOURCE_DIR) + "/docs/api.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string page = ss.str();
  const size_t begin = page.find("<!-- responses-fields:begin -->");
  const size_t end = page.find("<!-- responses-fields:end -->");
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  const std::regex row(R"(\| `([a-z_]+)` \| (supported|rejected|ignored) \|)");
  std::map<std::string, std::string> documented;
  const std::string table = page.substr(begin, end - begin);
  for (auto it = std::sregex_iterator(table.begin(), table.end(), row); it != std::sregex_iterator(); ++it)
    CHECK(documented.emplace((*it)[1].str(), (*it)[2].str()).second);
  for (const RequestFieldSpec& spec : responses_field_specs()) {
    INFO(spec.name);
    const auto found = documented.find(spec.name);
    REQUIRE(found != documented.end());
    CHECK(found->second == field_status_name(spec.status));
  }
  CHECK(documented.size() == responses_field_specs().size());
}
