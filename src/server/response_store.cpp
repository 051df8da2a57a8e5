// server/response_store.cpp: ResponseStore.
#include "server/response_store.h"

namespace k3::server {

void ResponseStore::put(const std::string& id, Json conversation) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    order_.erase(it->second.age);
    entries_.erase(it);
  }
  order_.push_front(id);
  entries_.emplace(id, Entry{std::move(conversation), order_.begin()});
  while (entries_.size() > capacity_) {
    entries_.erase(order_.back());
    order_.pop_back();
  }
}

std::optional<Json> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second.age);
  return it->second.conversation;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace k3::server
