#pragma once
// Request errors as values (STYLE habit 8): every way a client request can fail becomes an
// ApiError carrying its HTTP status and the OpenAI error object's fields, so the HTTP layer only
// serializes it. Nothing a client sends throws past the front end.
#include <string>

#include <nlohmann/json.hpp>

namespace fp8serve {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // OpenAI's error types
  std::string param;                           // empty -> null
  std::string code;                            // empty -> null
  int retry_after_s = 0;                       // > 0: send a Retry-After header (429/503)
};

// {"error": {"message", "type", "param", "code"}}, as the official clients parse it.
nlohmann::ordered_json error_body(const ApiError& error);

// The common cases, named so call sites read as the rule they enforce.
ApiError bad_request(std::string message, std::string param = {}, std::string code = {});
ApiError not_found(std::string message, std::string code = {});
ApiError unauthorized();
ApiError method_not_allowed(const std::string& method, const std::string& target);
ApiError service_unavailable(std::string message, int retry_after_s);
ApiError internal_error(const std::string& request_id);

}  // namespace fp8serve
