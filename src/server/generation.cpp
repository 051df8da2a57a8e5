// server/generation.cpp: Generation.
#include "server/generation.h"

#include <algorithm>

namespace k3::server {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

struct Generation::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> queue;
  std::vector<bool> final_delivered;  // per choice
  std::vector<bool> stopped_early;    // per choice: aborted because a stop string matched
  int pending = 0;                    // choices without their final event
  std::string shutdown;
  std::shared_ptr<Metrics> metrics;  // shared: the engine may outlive the server
  // Step-thread only (timing).
  struct Timing {
    Clock::time_point submitted, last_token;
    bool has_token = false;
    int64_t max_tokens = 0;  // as resolved for the choice
  };
  std::vector<Timing> timing;
  // The choices of one prompt (mu): vLLM observes n and the longest output once per prompt.
  struct PromptGroup {
    int left = 0;
    int64_t max_output_tokens = 0;
  };
  int n = 1;  // choices per prompt
  std::vector<PromptGroup> groups;

  void on_event(int choice, const engine::TokenEvent& e) {
    const Clock::time_point now = Clock::now();
    Timing& t = timing[static_cast<size_t>(choice)];
    if (metrics && e.token >= 0) {
      if (!t.has_token) metrics->observe_ttft(seconds(t.submitted, now));
      else metrics->observe_inter_token(seconds(t.last_token, now));
    }
    if (e.token >= 0) t.has_token = true, t.last_token = now;
    {
      std::lock_guard lock(mu);
      if (metrics && e.finished) {
        metrics->observe_e2e(seconds(t.submitted, now));
        const bool stop = e.reason == engine::FinishReason::abort && stopped_early[static_cast<size_t>(choice)];
        metrics->count_finished(stop ? engine::FinishReason::stop : e.reason);
        metrics->observe_finished(e.stats, t.max_tokens);
        PromptGroup& g = groups[static_cast<size_t>(choice / n)];
        g.max_output_tokens = std::max(g.max_output_tokens, e.stats.output_tokens);
        if (--g.left == 0) metrics->observe_prompt_finished(n, g.max_output_tokens);
      }
      queue.push_back({choice, e});
      if (e.finished) {
        final_delivered[static_cast<size_t>(choice)] = true;
        --pending;
      }
    }
    cv.notify_all();
  }
};

Generation::Generation(engine::Engine& engine, std::shared_ptr<Metrics> metrics)
    : engine_(engine), shared_(std::make_shared<Shared>()) {
  shared_->metrics = std::move(metrics);
}

Generation::~Generation() { abort_all(); }

void Generation::submit(std::vector<engine::GenerateRequest> choices, int n) {
  {
    std::lock_guard lock(shared_->mu);
    const int num = static_cast<int>(choices.size());
    shared_->n = n > 0 && num % n == 0 ? n : std::max(num, 1);  // a count that does not divide: one prompt
    shared_->groups.assign(static_cast<size_t>(num / shared_->n), {shared_->n, 0});
    shared_->final_delivered.assign(choices.size(), false);
    shared_->stopped_early.assign(choices.size(), false);
    shared_->pending = static_cast<int>(choices.size());
    // Sized before any submission: the step thread indexes it from the first event on.
    shared_->timing.assign(choices.size(), Shared::Timing{});
  }
  ids_.reserve(choices.size());
  for (size_t c = 0; c < choices.size(); ++c) {
    engine::GenerateRequest& r = choices[c];
    // The callback shares the queue: the engine drops it with the request's context.
    std::shared_ptr<Shared> strong = shared_;
    const int choice = static_cast<int>(c);
    r.on_event = [strong, choice](const engine::TokenEvent& e) { strong->on_event(choice, e); };
    shared_->timing[c].max_tokens = r.max_tokens;
    shared_->timing[c].submitted = Clock::now();
    try {
      ids_.push_back(engine_.submit(std::move(r)).id);
    } catch (...) {
      // The refused choice and those never submitted have no final event to wait for.
      {
        std::lock_guard lock(shared_->mu);
        for (size_t k = c; k < choices.size(); ++k) shared_->final_delivered[k] = true;
        shared_->pending -= static_cast<int>(choices.size() - c);
      }
      abort_all();
      throw;
    }
  }
}

bool Generation::wait(std::chrono::milliseconds timeout, std::vector<Event>& out) {
  std::unique_lock lock(shared_->mu);
  if (shared_->queue.empty()) shared_->cv.wait_for(lock, timeout, [&] { return !shared_->queue.empty(); });
  if (shared_->queue.empty()) return false;
  while (!shared_->queue.empty()) {
    out.push_back(std::move(shared_->queue.front()));
    shared_->queue.pop_front();
  }
  return true;
}

void Generation::abort(int choice) {
  const auto c = static_cast<size_t>(choice);
  if (c >= ids_.size()) return;
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->final_delivered[c]) return;
  }
  engine_.abort(ids_[c]);  // false when it finished meanwhile: fine
}

void Generation::stop_early(int choice) {
  const auto c = static_cast<size_t>(choice);
  if (c >= ids_.size()) return;
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->final_delivered[c]) return;
    shared_->stopped_early[c] = true;
  }
  engine_.abort(ids_[c]);
}

void Generation::abort_all() {
  for (int c = 0; c < num_choices(); ++c) abort(c);
}

void Generation::shut_down(const std::string& reason) {
  {
    std::lock_guard lock(shared_->mu);
    if (shared_->shutdown.empty()) shared_->shutdown = reason;
  }
  abort_all();
  shared_->cv.notify_all();
}

std::string Generation::shutdown_reason() const {
  std::lock_guard lock(shared_->mu);
  return shared_->shutdown;
}

bool Generation::engine_done() const {
  std::lock_guard lock(shared_->mu);
  return shared_->pending <= 0;
}

}  // namespace k3::server
