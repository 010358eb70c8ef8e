#pragma once
// Internal to server/api: reading the optional fields of a request body with OpenAI's rules
// (absent and null mean "not given"), and the one way the parsers fail: reject(), a 400 that
// names the parameter, thrown inside the parsers and turned into a value at their boundary.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api/errors.hpp"

namespace fp8serve::api_detail {

using Json = nlohmann::ordered_json;

struct Rejected {
  ApiError error;
};

[[noreturn]] inline void reject(const std::string& param, const std::string& message, const std::string& code = {}) {
  throw Rejected{bad_request(message, param, code)};
}

std::string type_name(const Json& v);  // "a string", "an array", ... for messages

// Reads optional fields of one JSON object.
class Fields {
 public:
  explicit Fields(const Json& object) : object_(object) {}

  const Json* find(const char* key) const;
  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) const;
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const;
  std::optional<bool> boolean(const char* key) const;
  std::optional<std::string> string(const char* key) const;

  // 5.0 is accepted as 5 (JSON has one number type); 5.5, booleans and strings are not.
  static int64_t as_integer(const Json& v, const std::string& param, int64_t lo, int64_t hi);

 private:
  const Json& object_;
};

}  // namespace fp8serve::api_detail
