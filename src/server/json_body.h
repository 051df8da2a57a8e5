// server/json_body.h: reading of a JSON request body. Every field the endpoint knows is
// declared up front; any other key is either a 400 naming it (strict objects) or collected into
// `ignored` for the handler to log and count (request bodies: clients send vendor extras that
// change nothing, and vLLM accepts them the same way). Fields that would change the output but
// cannot be honoured are declared and refused explicitly by their parsers. Typed getters
// treat null as absent (OpenAI accepts null for optional fields) and throw ApiError naming the
// field, the expected type or range, and the value received.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace k3::server {

using Json = nlohmann::ordered_json;  // keeps key order (tool declarations render in client order)

// Deepest nesting a body may have: deeper input is refused before it reaches the parser, so no
// recursive consumer (dump, the chat renderer) can run out of stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body; 400 when it is not JSON (nlohmann's message says where), nests deeper
// than kMaxJsonDepth, or is not an object. Strings must be valid UTF-8 (the parser checks).
Json parse_body(std::string_view body);

// JSON text for the wire; invalid UTF-8 (which only the model can produce) becomes U+FFFD
// instead of throwing.
std::string dump_json(const Json& j);
std::string dump_json(const nlohmann::json& j);

class JsonFields {
 public:
  // Throws 400 (code "unknown_parameter") for the first key not in `known`, or, with `ignored`,
  // appends the full name of each such key there instead.
  JsonFields(const Json& object, const std::vector<std::string_view>& known, std::string prefix = {},
             std::vector<std::string>* ignored = nullptr);

  // Present and not null.
  bool has(std::string_view key) const;
  const Json* get(std::string_view key) const;  // nullptr when absent or null

  std::optional<bool> boolean(std::string_view key) const;
  std::optional<std::string> string(std::string_view key) const;
  // A JSON integer (1.0 is accepted, 1.5 is not) in [lo, hi].
  std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi) const;
  // A finite JSON number in [lo, hi] (or (lo, hi] with lo_open).
  std::optional<double> number(std::string_view key, double lo, double hi, bool lo_open = false) const;

  std::string name(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  const Json& object_;
  std::string prefix_;
};

// obj[key] as a string: `fallback` when absent or null, a 400 naming `path.key` when it is
// something else (for parsers that read objects without a JsonFields).
std::string string_or(const Json& obj, std::string_view key, const std::string& fallback, const std::string& path);

// "a string", "an integer", ... for messages.
std::string json_type_name(const Json& j);
// The value as it appeared, shortened for an error message.
std::string json_excerpt(const Json& j);

}  // namespace k3::server
