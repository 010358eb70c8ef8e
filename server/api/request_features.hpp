#pragma once
// Every request field of /v1/completions, /v1/chat/completions and /v1/responses that OpenAI's
// API or vLLM's defines, with what this server does with it: supported, rejected (a 400 when the request asks
// for what the field means), or accepted and ignored (with the reason). One table, used three
// ways: the parser refuses any field that is not in it (a typo such as "temprature" must not
// silently fall back to the default), check_request_fields() turns each rejection rule into a
// 400 here and nowhere else, and a unit test keeps docs/api.md's table equal to it.
//
// Structured output and tool calling: the shape of response_format, tools and tool_choice is
// checked here; structured_output.cpp and tool_calls.cpp do the rest.
#include <span>

#include <nlohmann/json.hpp>

#include "server/api/request.hpp"

namespace fp8serve {

enum class FieldStatus { supported, rejected, ignored };

enum FieldEndpoints : unsigned { kCompletionField = 1, kChatField = 2, kBothEndpoints = 3, kResponsesField = 4 };

// When a rejected field refuses the request; null (= absent) never does.
enum class Refuse { never, any_value, true_value, false_value, non_empty, non_zero, custom };

// The JSON type a field that is not parsed elsewhere must have (checked before the rule).
enum class FieldType { any, boolean, number, string, object, array };

struct RequestFieldSpec {
  const char* name;
  unsigned endpoints;  // FieldEndpoints
  FieldStatus status;
  Refuse refuse;
  FieldType type;
  const char* origin;  // "OpenAI", "vLLM" or "OpenAI, vLLM"
  const char* note;    // what is accepted, refused or why it is ignored; ends the 400 message
  // JSON members (without braces) that a request may add: `accepted` must be taken, `refused`
  // must get a 400 naming the field. The unit and integration tests send both for every row.
  const char* accepted;
  const char* refused;
};

std::span<const RequestFieldSpec> request_field_specs();
// /v1/responses: a table of its own (every row kResponsesField), checked the same way.
std::span<const RequestFieldSpec> responses_field_specs();
const char* field_status_name(FieldStatus status);

// PRECOND: `body` is a JSON object. Throws api_detail::Rejected (a 400 naming the field) for a
// field that is not in the table for `kind`, a field of the wrong type, or one that asks for a
// feature this server does not have.
void check_request_fields(const nlohmann::ordered_json& body, ApiKind kind, std::span<const std::string> ignored = {});
// The same for a /v1/responses body: the table's rules; the parser (responses_api.cpp) checks
// the shape of the supported fields.
void check_responses_fields(const nlohmann::ordered_json& body, std::span<const std::string> ignored = {});
// Empty when `name` may be listed in --ignore-request-fields (no endpoint knows it), else why not.
std::string why_not_ignorable(const std::string& name);

}  // namespace fp8serve
