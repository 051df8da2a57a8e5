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

}  // namespace k3::server
