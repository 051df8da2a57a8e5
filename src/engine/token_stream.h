// engine/token_stream.h: what a client gets back from Engine::submit: its request's events,
// pushed by the step loop and popped by the client (blocking or not), thread-safe.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/request.h"

namespace k3::engine {

using scheduler::FinishReason;
using scheduler::RequestId;
using scheduler::RequestStats;

struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;  // the new token; -1 when the event carries only a finish (abort, error)
  float logprob = 0;   // of `token` (runner/sampler.h step 4)
  std::vector<std::pair<int32_t, float>> top_logprobs;  // the request's `logprobs` most likely
  bool finished = false;                                // the request's last event
  FinishReason reason = FinishReason::stop;
  std::string error;   // reason == error: what failed
  RequestStats stats;  // complete on the last event; the first token's has those known then
};

class TokenStream {
 public:
  // Blocks until an event exists; nullopt once the last event has been taken.
  std::optional<TokenEvent> next();
  // Like next() but gives up after `timeout` (nullopt then too; check done()).
  std::optional<TokenEvent> next_for(std::chrono::milliseconds timeout);
  // An event if one is queued now.
  std::optional<TokenEvent> try_next();
  // The last event has been taken.
  bool done() const;

  // Step-loop side.
  void push(TokenEvent e);

 private:
  std::optional<TokenEvent> take_locked();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool final_pushed_ = false, final_taken_ = false;
};

}  // namespace k3::engine
