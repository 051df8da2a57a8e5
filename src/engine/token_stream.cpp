// engine/token_stream.cpp: TokenStream.
#include "engine/token_stream.h"

namespace k3::engine {

std::optional<TokenEvent> TokenStream::take_locked() {
  if (events_.empty()) return std::nullopt;
  TokenEvent e = std::move(events_.front());
  events_.pop_front();
  if (e.finished) final_taken_ = true;
  return e;
}

std::optional<TokenEvent> TokenStream::next() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !events_.empty() || final_taken_; });
  return take_locked();
}

std::optional<TokenEvent> TokenStream::next_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || final_taken_; });
  return take_locked();
}

std::optional<TokenEvent> TokenStream::try_next() {
  std::lock_guard lock(mu_);
  return take_locked();
}

bool TokenStream::done() const {
  std::lock_guard lock(mu_);
  return final_taken_;
}

void TokenStream::push(TokenEvent e) {
  {
    std::lock_guard lock(mu_);
    if (final_pushed_) return;  // nothing follows a request's last event
    final_pushed_ = e.finished;
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

}  // namespace k3::engine
