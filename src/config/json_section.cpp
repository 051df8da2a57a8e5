// config/json_section.cpp: Section, typed JSON reads whose errors name the source and key.
#include "config/json_section.h"

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace k3::config::detail {

using nlohmann::json;

std::string json_type_phrase(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported JSON value";
  }
}

namespace {
// The offending value, short enough for one line.
std::string brief(const json& v) {
  std::string s = v.dump();
  if (s.size() > 48) s = s.substr(0, 45) + "...";
  return s;
}
std::string got(const json& v) { return "got " + json_type_phrase(v) + " " + brief(v); }
}  // namespace

void Section::fail(const std::string& key, const std::string& what) const {
  throw core::Error(source_ + ": " + path(key) + ": " + what);
}

const json* Section::find(const std::string& key) const {
  if (!obj_.is_object()) return nullptr;
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& Section::require(const std::string& key, const char* expected) const {
  const json* v = find(key);
  if (v == nullptr) {
    const bool is_null = obj_.is_object() && obj_.contains(key);
    fail(key, std::string(is_null ? "is null" : "required key is missing") + ", expected " + expected);
  }
  return *v;
}

int Section::as_int(const std::string& key, const json& v) const {
  if (!v.is_number_integer()) fail(key, "expected an integer, " + got(v));
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT_MAX)) fail(key, "value " + brief(v) + " is too large");
    return static_cast<int>(u);
  }
  const int64_t s = v.get<int64_t>();
  if (s > INT_MAX || s < INT_MIN) fail(key, "value " + brief(v) + " is out of 32-bit range");
  return static_cast<int>(s);
}

float Section::as_float(const std::string& key, const json& v) const {
  if (!v.is_number()) fail(key, "expected a number, " + got(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > FLT_MAX) fail(key, "value " + brief(v) + " does not fit a 32-bit float");
  return static_cast<float>(d);
}

bool Section::as_bool(const std::string& key, const json& v) const {
  if (!v.is_boolean()) fail(key, "expected a boolean (true/false), " + got(v));
  return v.get<bool>();
}

std::string Section::as_string(const std::string& key, const json& v) const {
  if (!v.is_string()) fail(key, "expected a string, " + got(v));
  return v.get<std::string>();
}

int Section::req_int(const std::string& key) const { return as_int(key, require(key, "an integer")); }

int Section::opt_int(const std::string& key, int fallback) const {
  const json* v = find(key);
  return v ? as_int(key, *v) : fallback;
}

float Section::req_float(const std::string& key) const { return as_float(key, require(key, "a number")); }

float Section::opt_float(const std::string& key, float fallback) const {
  const json* v = find(key);
  return v ? as_float(key, *v) : fallback;
}

bool Section::opt_bool(const std::string& key, bool fallback) const {
  const json* v = find(key);
  return v ? as_bool(key, *v) : fallback;
}

std::string Section::opt_string(const std::string& key, const std::string& fallback) const {
  const json* v = find(key);
  return v ? as_string(key, *v) : fallback;
}

Section Section::sub(const std::string& key) const {
  const json& v = require(key, "an object");
  if (!v.is_object()) fail(key, "expected an object, " + got(v));
  return Section(v, source_, path(key) + ".");
}

std::vector<int> Section::req_int_list(const std::string& key) const {
  const json& v = require(key, "an array of integers");
  if (!v.is_array()) fail(key, "expected an array of integers, " + got(v));
  std::vector<int> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_int(key + "[" + std::to_string(i) + "]", v[i]));
  return out;
}

}  // namespace k3::config::detail
