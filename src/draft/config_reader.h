// draft/config_reader.h: typed reads of a draft's config.json keys, each problem an error naming the
// source file and the key (shared by the DSpark and EAGLE-3 configs; not part of the public API).
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace k3::draft::detail {

using nlohmann::json;

inline std::string type_phrase(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Typed reads of the keys of one JSON object.
class Reader {
 public:
  Reader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw core::Error(source_ + ": " + key + ": " + what);
  }
  const json* find(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int as_int(const std::string& key, const json& v) const {
    if (v.is_number_integer() || v.is_number_unsigned()) {
      const auto x = v.get<int64_t>();
      if (x < INT32_MIN || x > INT32_MAX) fail(key, "integer " + v.dump() + " out of range");
      return static_cast<int>(x);
    }
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 2e9)
      return static_cast<int>(v.get<double>());
    fail(key, "expected an integer, got " + type_phrase(v) + " " + v.dump());
  }
  int req_int(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "missing (required)");
    return as_int(key, *v);
  }
  int opt_int(const std::string& key, int fallback) const {
    const json* v = find(key);
    return v ? as_int(key, *v) : fallback;
  }
  float opt_float(const std::string& key, float fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) fail(key, "expected a number, got " + type_phrase(*v) + " " + v->dump());
    return v->get<float>();
  }
  bool opt_bool(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, "expected true or false, got " + type_phrase(*v) + " " + v->dump());
    return v->get<bool>();
  }
  std::string opt_string(const std::string& key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, "expected a string, got " + type_phrase(*v) + " " + v->dump());
    return v->get<std::string>();
  }
  std::vector<int> req_int_list(const std::string& key) const {
    const json* v = find(key);
    if (!v) fail(key, "missing (required)");
    if (!v->is_array()) fail(key, "expected a list of integers, got " + type_phrase(*v) + " " + v->dump());
    std::vector<int> out;
    for (size_t i = 0; i < v->size(); ++i) out.push_back(as_int(key + "[" + std::to_string(i) + "]", (*v)[i]));
    return out;
  }

 private:
  const json& j_;
  std::string source_;
};

// A config.json (or the config.json of a folder) parsed; `what` names it in errors. Returns the
// path read beside the JSON.
inline std::pair<json, std::string> read_config_json(const std::filesystem::path& path_in, const std::string& what) {
  std::filesystem::path path = path_in;
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream f(path);
  if (!f) throw core::Error(path.string() + ": cannot open the " + what);
  try {
    return {json::parse(f), path.string()};
  } catch (const json::parse_error& e) {
    throw core::Error(path.string() + ": not valid JSON: " + e.what());
  }
}

inline void require(bool ok, const std::string& source, const std::string& key, const std::string& what) {
  if (!ok) throw core::Error(source + ": " + key + ": " + what);
}

}  // namespace k3::draft::detail
