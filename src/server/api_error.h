// server/api_error.h: an error the server answers with OpenAI's error body,
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}},
// and the HTTP status that goes with it. Thrown by request parsing and the handlers; the
// handler boundary turns it into the reply, so nothing a client sends goes unanswered.
#pragma once
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace k3::server {

struct ApiError : std::runtime_error {
  int status;
  std::string type;   // "invalid_request_error", "not_found_error", "server_error", ...
  std::string param;  // the request field at fault; empty -> null
  std::string code;   // a machine-readable reason; empty -> null

  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {},
           std::string type = {});
};

// 400 naming the field: the common case.
inline ApiError bad_request(const std::string& message, std::string param = {}, std::string code = "invalid_value") {
  return ApiError(400, message, std::move(param), std::move(code));
}

nlohmann::json error_body(const ApiError& e);
// Anthropic's shape of the same error: {"type": "error", "error": {"type": ..., "message": ...}}
// with Anthropic's type names (invalid_request_error, authentication_error, permission_error,
// not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error).
nlohmann::json anthropic_error_body(const ApiError& e);
// The status Anthropic clients expect for ours: 503 (draining, overloaded) is 529 there.
int anthropic_status(int status);
// The error type OpenAI uses for a status (400 -> invalid_request_error, 5xx -> server_error).
std::string error_type_for_status(int status);

}  // namespace k3::server
