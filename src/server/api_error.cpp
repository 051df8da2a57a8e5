// server/api_error.cpp: OpenAI-style error bodies.
#include "server/api_error.h"

namespace k3::server {

std::string error_type_for_status(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError::ApiError(int status_, const std::string& message, std::string param_, std::string code_, std::string type_)
    : std::runtime_error(message),
      status(status_),
      type(type_.empty() ? error_type_for_status(status_) : std::move(type_)),
      param(std::move(param_)),
      code(std::move(code_)) {}

nlohmann::json error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

int anthropic_status(int status) { return status == 503 ? 529 : status; }

nlohmann::json anthropic_error_body(const ApiError& e) {
  std::string type;
  switch (anthropic_status(e.status)) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 529: type = "overloaded_error"; break;
    default: type = e.status >= 500 ? "api_error" : "invalid_request_error"; break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

}  // namespace k3::server
