// config/json_section.h: typed, key-naming reads from one JSON object of a config file.
//
// Private to src/config. Every read goes through a Section, which knows the source (file or
// builtin name) and the key path of its object ("text_config.linear_attn_config."), so any
// problem becomes a core::Error such as
//   "x/config.json: text_config.linear_attn_config.head_dim: expected an integer, got a string "a""
// and nlohmann's own type_error never escapes to the user.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::config::detail {

class Section {
 public:
  Section(const nlohmann::json& obj, std::string source, std::string prefix)
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  // Full key path for messages: prefix + key.
  std::string path(const std::string& key) const { return prefix_ + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

  // The value of key, or nullptr when the key is absent or JSON null (both mean "not given").
  const nlohmann::json* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  int req_int(const std::string& key) const;
  int opt_int(const std::string& key, int fallback) const;
  float req_float(const std::string& key) const;
  float opt_float(const std::string& key, float fallback) const;
  bool opt_bool(const std::string& key, bool fallback) const;
  std::string opt_string(const std::string& key, const std::string& fallback) const;
  // A nested object; required (error if absent) or optional (nullptr-like: has() first).
  Section sub(const std::string& key) const;
  // A list of integers (each element's error names key[i]).
  std::vector<int> req_int_list(const std::string& key) const;

  // Converters for a value already found under key (also used for array elements).
  int as_int(const std::string& key, const nlohmann::json& v) const;
  float as_float(const std::string& key, const nlohmann::json& v) const;
  bool as_bool(const std::string& key, const nlohmann::json& v) const;
  std::string as_string(const std::string& key, const nlohmann::json& v) const;

 private:
  const nlohmann::json& require(const std::string& key, const char* expected) const;
  const nlohmann::json& obj_;
  std::string source_;
  std::string prefix_;
};

// "an integer", "a string", ... for messages.
std::string json_type_phrase(const nlohmann::json& v);

}  // namespace k3::config::detail
