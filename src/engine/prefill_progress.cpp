// engine/prefill_progress.cpp: PrefillProgress.
#include "engine/prefill_progress.h"

#include <cstdio>

namespace k3::engine {

PrefillProgress::PrefillProgress(Log log, int64_t min_prompt_tokens, std::chrono::milliseconds interval)
    : log_(std::move(log)), min_prompt_tokens_(min_prompt_tokens), interval_(interval) {}

void PrefillProgress::begin(scheduler::RequestId id, int64_t prompt_tokens) {
  if (log_ && prompt_tokens >= min_prompt_tokens_) entries_[id] = Entry{prompt_tokens};
}

void PrefillProgress::end(scheduler::RequestId id) { entries_.erase(id); }

void PrefillProgress::step(const scheduler::StepPlan& out, Clock::time_point now) {
  if (entries_.empty()) return;
  for (const scheduler::ScheduledSequence& s : out.seqs) {
    if (s.kind != scheduler::StepKind::prefill) continue;
    const auto it = entries_.find(s.id);
    if (it == entries_.end()) continue;
    Entry& e = it->second;
    if (e.first_computed < 0 || s.start < e.first_computed) {  // first chunk, or restarted after a preemption
      e.first_computed = s.start;
      e.started = e.last_report = now;
    }
    const int64_t done = std::min(s.start + s.num_tokens, e.prompt_tokens);
    const bool finished = done >= e.prompt_tokens;
    if (!finished && now - e.last_report < interval_) continue;
    e.last_report = now;
    const double secs = std::chrono::duration<double>(now - e.started).count();
    const double rate = secs > 0 ? static_cast<double>(done - e.first_computed) / secs : 0.0;
    char line[256];
    std::snprintf(line, sizeof line, "prefill: request %llu: %lld / %lld prompt tokens (%d%%), %.0f tokens/s, %.1f s%s",
                  static_cast<unsigned long long>(s.id), static_cast<long long>(done),
                  static_cast<long long>(e.prompt_tokens), static_cast<int>(100 * done / e.prompt_tokens), rate, secs,
                  e.first_computed > 0 ? (" (" + std::to_string(e.first_computed) + " from the prefix cache)").c_str()
                                       : "");
    log_(line);
    if (finished) entries_.erase(it);
  }
}

}  // namespace k3::engine
