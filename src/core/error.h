// core/error.h: the project's error type and a Status for "can this run, and if not, why".
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace k3::core {

// Thrown for bad input of any kind (config, checkpoint, CLI, request). The message names
// what is wrong (file, key, tensor) so a user can fix it without reading code.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Result of a capability check (registry supports(), validation): ok, or a reason.
class Status {
 public:
  static Status ok() { return Status(); }
  static Status fail(std::string reason) { return Status(std::move(reason)); }
  bool is_ok() const { return reason_.empty(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& reason() const { return reason_; }

 private:
  Status() = default;
  explicit Status(std::string reason) : reason_(std::move(reason)) {
    if (reason_.empty()) reason_ = "unspecified";
  }
  std::string reason_;
};

#define K3_CHECK(cond, msg)                                 \
  do {                                                      \
    if (!(cond)) throw ::k3::core::Error(std::string(msg)); \
  } while (0)

}  // namespace k3::core
