#include "server/api/errors.hpp"

namespace fp8serve {

nlohmann::ordered_json error_body(const ApiError& error) {
  nlohmann::ordered_json inner = {{"message", error.message}, {"type", error.type}, {"param", nullptr}, {"code", nullptr}};
  if (!error.param.empty()) inner["param"] = error.param;
  if (!error.code.empty()) inner["code"] = error.code;
  return {{"error", std::move(inner)}};
}

ApiError bad_request(std::string message, std::string param, std::string code) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code), 0};
}

ApiError not_found(std::string message, std::string code) {
  return ApiError{404, std::move(message), "invalid_request_error", {}, std::move(code), 0};
}

ApiError unauthorized() {
  return ApiError{401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'.", "invalid_request_error",
                  {}, "invalid_api_key", 0};
}

ApiError method_not_allowed(const std::string& method, const std::string& target) {
  return ApiError{405, "Method " + method + " is not allowed on " + target + ".", "invalid_request_error", {},
                  "method_not_allowed", 0};
}

ApiError service_unavailable(std::string message, int retry_after_s) {
  return ApiError{503, std::move(message), "server_error", {}, "service_unavailable", retry_after_s};
}

ApiError internal_error(const std::string& request_id) {
  return ApiError{500, "Internal server error (request " + request_id + "); the server log has the details.",
                  "server_error", {}, {}, 0};
}

}  // namespace fp8serve
