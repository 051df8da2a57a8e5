// loadgen/runner.cpp: worker threads, arrivals, sessions with pauses and sub-agents.
#include "loadgen/runner.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

namespace k3::loadgen {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

Json RunOptions::to_json() const {
  return {{"mode", mode},
          {"concurrency", concurrency},
          {"request_rate", std::isinf(request_rate) ? Json("inf") : Json(request_rate)},
          {"warmup_requests", warmup_requests},
          {"max_duration_s", max_duration_s},
          {"seed", seed}};
}

void RunOptions::validate() const {
  K3_CHECK(mode == "concurrency" || mode == "rate", "run: mode must be concurrency or rate, got '" + mode + "'");
  if (mode == "concurrency")
    K3_CHECK(concurrency >= 1, "run: --concurrency must be >= 1, got " + std::to_string(concurrency));
  else K3_CHECK(concurrency >= 0, "run: --concurrency (the in-flight cap in rate mode) must be >= 0");
  if (mode == "rate") K3_CHECK(request_rate > 0, "run: --request-rate must be > 0 in rate mode");
  K3_CHECK(warmup_requests >= 0, "run: --warmup must be >= 0");
  K3_CHECK(max_duration_s >= 0, "run: --max-duration must be >= 0");
}

namespace {

// Shared state of one run.
struct Run {
  const Endpoint& endpoint;
  Clock::time_point start;
  Clock::time_point deadline;  // no request starts after it
  std::mutex mu;
  std::vector<RequestSample> samples;
  std::atomic<bool> skipped{false};

  bool past_deadline() const { return Clock::now() >= deadline; }
  // Sleeps `s` seconds; false when the deadline comes first.
  bool pause(double s) {
    if (s <= 0) return !past_deadline();
    const auto wake = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    std::this_thread::sleep_until(std::min(wake, deadline));
    return !past_deadline();
  }
  void record(RequestSample s) {
    std::lock_guard lock(mu);
    samples.push_back(std::move(s));
  }
};

// Runs one session's turns in order on `client`; `context` is the prompt so far (a sub-agent
// starts from its parent's). Stops at the first failed request or at the deadline.
void run_session(Run& run, ApiClient& client, const Session& session, std::vector<int32_t> context) {
  for (size_t t = 0; t < session.turns.size(); ++t) {
    const Turn& turn = session.turns[t];
    if (!run.pause(turn.delay_before_s)) {
      run.skipped = true;
      return;
    }
    if (turn.reset_context) context = turn.append;
    else context.insert(context.end(), turn.append.begin(), turn.append.end());
    RequestSample s = client.stream_completion(context, turn.output_tokens, run.start);
    s.session = session.id;
    s.turn = static_cast<int64_t>(t);
    const bool ok = s.ok;
    run.record(std::move(s));
    if (!ok) return;
    if (!turn.subagents.empty()) {
      std::vector<std::thread> subs;
      for (const Session& sub : turn.subagents)
        subs.emplace_back([&run, &sub, context] {
          ApiClient own(run.endpoint);
          run_session(run, own, sub, context);
        });
      for (std::thread& th : subs) th.join();
    }
  }
}

std::map<std::string, double> scrape(ApiClient& client, std::string& error) {
  try {
    return parse_prometheus(client.get("/metrics"));
  } catch (const core::Error& e) {
    error = e.what();
    return {};
  }
}

}  // namespace

std::vector<double> arrival_times(const std::vector<Session>& sessions, double rate, uint64_t seed) {
  K3_CHECK(rate > 0, "run: the request rate must be > 0, got " + std::to_string(rate));
  core::Rng rng(seed ^ 0x4152524956414c00ull);
  std::vector<double> out;
  double t = 0;
  for (const Session& s : sessions) {
    if (s.arrival_s >= 0) t = s.arrival_s;
    else if (!std::isinf(rate)) t += -std::log(1.0 - rng.uniform()) / rate;
    out.push_back(t);
  }
  return out;
}

RunResult run_load(const Endpoint& endpoint, const std::vector<Session>& sessions, const RunOptions& options) {
  options.validate();
  K3_CHECK(!sessions.empty(), "run: the workload has no sessions");
  RunResult result;
  ApiClient control(endpoint);

  // Warm-up: fresh prompts of the first request's shape, so the measured requests find nothing of
  // theirs in the prefix cache.
  if (options.warmup_requests > 0) {
    const Turn& first = sessions.front().turns.front();
    core::Rng rng(options.seed ^ 0x5741524d55500000ull);
    for (int64_t i = 0; i < options.warmup_requests; ++i) {
      std::vector<int32_t> prompt(first.append.size());
      const int32_t lo = *std::min_element(first.append.begin(), first.append.end());
      const int32_t hi = *std::max_element(first.append.begin(), first.append.end());
      for (int32_t& id : prompt) id = lo + static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(hi - lo + 1));
      if (!control.stream_completion(prompt, first.output_tokens, Clock::now()).ok) ++result.warmup_failed;
    }
  }
  result.metrics_before = scrape(control, result.metrics_error);

  Run run{endpoint, Clock::now(), Clock::time_point::max(), {}, {}, {}};
  if (options.max_duration_s > 0)
    run.deadline = run.start +
                   std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.max_duration_s));

  // Progress for long runs: finished requests so far, every progress_s seconds.
  std::mutex progress_mu;
  std::condition_variable progress_cv;
  bool finished = false;
  std::thread progress;
  if (options.progress_s > 0)
    progress = std::thread([&] {
      const int64_t planned = count_requests(sessions);
      std::unique_lock lock(progress_mu);
      while (!progress_cv.wait_for(lock, std::chrono::duration<double>(options.progress_s), [&] { return finished; })) {
        size_t done = 0, failed = 0;
        {
          std::lock_guard samples_lock(run.mu);
          done = run.samples.size();
          for (const RequestSample& s : run.samples) failed += !s.ok;
        }
        char line[160];
        std::snprintf(line, sizeof line, "bench-serve: %zu/%lld requests done (%zu failed), %.0f s", done,
                      static_cast<long long>(planned), failed,
                      std::chrono::duration<double>(Clock::now() - run.start).count());
        log::info(line);
      }
    });

  if (options.mode == "concurrency") {
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (int64_t w = 0; w < options.concurrency; ++w)
      workers.emplace_back([&] {
        ApiClient client(endpoint);
        for (size_t i; (i = next.fetch_add(1)) < sessions.size();) {
          if (run.past_deadline()) {
            run.skipped = true;
            return;
          }
          run_session(run, client, sessions[i], {});
        }
      });
    for (std::thread& th : workers) th.join();
  } else {
    const std::vector<double> arrivals = arrival_times(sessions, options.request_rate, options.seed);
    std::mutex slots_mu;
    std::condition_variable slots_cv;
    int64_t in_flight = 0;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < sessions.size(); ++i) {
      const Session& session = sessions[i];
      if (!run.pause(arrivals[i] - std::chrono::duration<double>(Clock::now() - run.start).count())) {
        run.skipped = true;
        break;
      }
      if (options.concurrency > 0) {
        std::unique_lock lock(slots_mu);
        slots_cv.wait(lock, [&] { return in_flight < options.concurrency; });
      }
      {
        std::lock_guard lock(slots_mu);
        ++in_flight;
      }
      threads.emplace_back([&, s = &session] {
        ApiClient client(endpoint);
        run_session(run, client, *s, {});
        std::lock_guard lock(slots_mu);
        --in_flight;
        slots_cv.notify_all();
      });
    }
    for (std::thread& th : threads) th.join();
  }

  if (progress.joinable()) {
    {
      std::lock_guard lock(progress_mu);
      finished = true;
    }
    progress_cv.notify_all();
    progress.join();
  }
  result.hit_time_limit = run.skipped;
  result.samples = std::move(run.samples);
  double end = 0;
  double first = std::numeric_limits<double>::infinity();
  for (const RequestSample& s : result.samples) {
    end = std::max(end, s.start_s + s.e2e_s);
    first = std::min(first, s.start_s);
  }
  result.duration_s = result.samples.empty() ? 0 : end - std::min(first, end);
  // Times are kept relative to the run's start; duration is measured from the first request.
  result.metrics_after = scrape(control, result.metrics_error);
  return result;
}

}  // namespace k3::loadgen
