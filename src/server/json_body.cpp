// server/json_body.cpp: body parsing with a depth guard, and the strict field reader.
#include "server/json_body.h"

#include <cmath>

namespace k3::server {

namespace {

// Nesting depth of JSON text, counting brackets outside strings (escapes skipped). Cheap and
// linear; run before parsing so a million '[' never reach anything recursive.
int max_depth(std::string_view s) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxJsonDepth) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

Json parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos)
    throw bad_request("the request body is empty; expected a JSON object", {}, "invalid_json");
  if (max_depth(body) > kMaxJsonDepth)
    throw bad_request("the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels", {},
                      "invalid_json");
  Json j;
  try {
    j = Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw bad_request(std::string("the request body is not valid JSON: ") + e.what(), {}, "invalid_json");
  }
  if (!j.is_object())
    throw bad_request("the request body must be a JSON object, got " + json_type_name(j), {}, "invalid_json");
  return j;
}

std::string dump_json(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string string_or(const Json& obj, std::string_view key, const std::string& fallback, const std::string& path) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    const std::string name = path + "." + std::string(key);
    throw bad_request("'" + name + "' must be a string, got " + json_type_name(*it), name, "invalid_type");
  }
  return it->get<std::string>();
}

std::string json_type_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

std::string json_excerpt(const Json& j) {
  std::string s = dump_json(j);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

JsonFields::JsonFields(const Json& object, const std::vector<std::string_view>& known, std::string prefix,
                       std::vector<std::string>* ignored)
    : object_(object), prefix_(std::move(prefix)) {
  if (!object_.is_object())
    throw bad_request((prefix_.empty() ? std::string("the body") : prefix_.substr(0, prefix_.size() - 1)) +
                          " must be an object, got " + json_type_name(object_),
                      prefix_.empty() ? std::string() : prefix_.substr(0, prefix_.size() - 1), "invalid_type");
  for (const auto& [key, value] : object_.items()) {
    bool ok = false;
    for (std::string_view k : known) ok |= k == key;
    if (!ok && ignored) {
      ignored->push_back(name(key));
    } else if (!ok) {
      throw bad_request("unknown parameter '" + name(key) + "': this endpoint does not support it", name(key),
                        "unknown_parameter");
    }
  }
}

bool JsonFields::has(std::string_view key) const { return get(key) != nullptr; }

const Json* JsonFields::get(std::string_view key) const {
  const auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> JsonFields::boolean(std::string_view key) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    throw bad_request("'" + name(key) + "' must be a boolean, got " + json_type_name(*v), name(key), "invalid_type");
  return v->get<bool>();
}

std::optional<std::string> JsonFields::string(std::string_view key) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_string())
    throw bad_request("'" + name(key) + "' must be a string, got " + json_type_name(*v), name(key), "invalid_type");
  return v->get<std::string>();
}

std::optional<int64_t> JsonFields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  bool ok = false;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);  // range-checked below
    ok = true;
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
    ok = true;
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    ok = std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15;
    x = ok ? static_cast<int64_t>(d) : 0;
  }
  if (!ok)
    throw bad_request("'" + name(key) + "' must be an integer, got " + json_excerpt(*v), name(key), "invalid_type");
  if (x < lo || x > hi)
    throw bad_request("'" + name(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                          json_excerpt(*v),
                      name(key));
  return x;
}

std::optional<double> JsonFields::number(std::string_view key, double lo, double hi, bool lo_open) const {
  const Json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    throw bad_request("'" + name(key) + "' must be a number, got " + json_type_name(*v), name(key), "invalid_type");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    auto fmt = [](double d) {
      std::string s = std::to_string(d);
      while (s.size() > 1 && s.back() == '0') s.pop_back();
      if (s.back() == '.') s.pop_back();
      return s;
    };
    throw bad_request("'" + name(key) + "' must be in " + (lo_open ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "], got " +
                          json_excerpt(*v),
                      name(key));
  }
  return x;
}

}  // namespace k3::server
