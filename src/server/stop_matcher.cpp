// server/stop_matcher.cpp: StopMatcher.
#include "server/stop_matcher.h"

#include <algorithm>

namespace k3::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::feed(std::string_view piece) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(piece);
  held_.append(piece);
  // Earliest match; only text that was not searched before can complete one, but a match may
  // start anywhere in the held tail, so the whole buffer is searched (it is short).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_stop->size()))) {
      best = at;
      best_stop = &s;
    }
  }
  if (best_stop) {
    stopped_ = true;
    matched_ = *best_stop;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::finish() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace k3::server
