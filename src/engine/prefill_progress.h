// engine/prefill_progress.h: long prefills, reported as they go. A coding agent's first request
// is tens of thousands of tokens; on a CPU its prefill takes many seconds, and a server that
// says nothing meanwhile looks hung. For every prompt of at least `min_prompt_tokens`, one line
// at most every `interval` and one when the prefill is done:
//   prefill: request 7: 12288 / 54305 prompt tokens (22%), 1620 tokens/s, 7.6 s
// Step thread only (the engine's), so no locking.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "scheduler/step_plan.h"

namespace k3::engine {

class PrefillProgress {
 public:
  using Log = std::function<void(const std::string&)>;
  using Clock = std::chrono::steady_clock;

  explicit PrefillProgress(Log log = {}, int64_t min_prompt_tokens = 4096,
                           std::chrono::milliseconds interval = std::chrono::seconds(2));

  bool enabled() const { return static_cast<bool>(log_); }
  void begin(scheduler::RequestId id, int64_t prompt_tokens);  // a request arrived
  // After a step ran: the prefill chunks in it advance their requests. `now` for tests.
  void step(const scheduler::StepPlan& out, Clock::time_point now = Clock::now());
  void end(scheduler::RequestId id);  // finished, aborted or preempted for good

 private:
  struct Entry {
    int64_t prompt_tokens = 0;
    int64_t first_computed = -1;  // prompt tokens in the cache when its prefill began (prefix hit)
    Clock::time_point started{}, last_report{};
  };
  Log log_;
  int64_t min_prompt_tokens_;
  std::chrono::milliseconds interval_;
  std::unordered_map<scheduler::RequestId, Entry> entries_;
};

}  // namespace k3::engine
