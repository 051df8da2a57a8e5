// server/response_store.h: the /v1/responses store behind previous_response_id. A response made
// with store: true is kept as the conversation it ends (the chat messages of its input history
// and its own output, already in the renderer's shape), so a follow-up names it instead of
// resending the history. Bounded: the least recently used response goes first once
// `capacity` are kept; the store lives in memory and dies with the server.
#pragma once
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/json_body.h"

namespace k3::server {

class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}

  void put(const std::string& id, Json conversation);
  // The conversation response `id` ended (and marks it recently used); nullopt when unknown
  // or already evicted.
  std::optional<Json> get(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    Json conversation;
    std::list<std::string>::iterator age;
  };
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // most recently used first
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace k3::server
