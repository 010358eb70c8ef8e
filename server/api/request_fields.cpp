#include "server/api/request_fields.hpp"

#include <cmath>
#include <limits>

namespace fp8serve::api_detail {

namespace {

std::string format(double x) {
  if (std::trunc(x) == x && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  return Json(x).dump();
}

}  // namespace

std::string type_name(const Json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

const Json* Fields::find(const char* key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> Fields::number(const char* key, double lo, double hi, bool lo_open) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) reject(key, std::string("'") + key + "' must be a number, got " + type_name(*v) + ".");
  const double x = v->get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (below || !(x <= hi) || !std::isfinite(x)) {
    std::string range = std::string(lo_open ? "(" : "[") + format(lo) + ", " + format(hi) + "]";
    reject(key, std::string("'") + key + "' must be in " + range + ", got " + v->dump() + ".");
  }
  return x;
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  return as_integer(*v, key, lo, hi);
}

std::optional<bool> Fields::boolean(const char* key) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) reject(key, std::string("'") + key + "' must be a boolean, got " + type_name(*v) + ".");
  return v->get<bool>();
}

std::optional<std::string> Fields::string(const char* key) const {
  const Json* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) reject(key, std::string("'") + key + "' must be a string, got " + type_name(*v) + ".");
  return v->get<std::string>();
}

int64_t Fields::as_integer(const Json& v, const std::string& param, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      reject(param, "'" + param + "' must be at most " + std::to_string(hi) + ", got " + v.dump() + ".");
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e18) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    reject(param, "'" + param + "' must be an integer, got " + type_name(v) + ".");
  }
  if (x < lo || x > hi)
    reject(param, "'" + param + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                      std::to_string(x) + ".");
  return x;
}

}  // namespace fp8serve::api_detail
