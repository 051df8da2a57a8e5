// loadgen/runner.h: drives a workload against a server: fixed concurrency (N workers, each
// running whole sessions back to back) or a Poisson session arrival rate (trace sessions with
// timestamps arrive at those times instead), warm-up requests first, a bounded run time, and
// /metrics scraped before and after so server counters are read as deltas of the run alone.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/client.h"
#include "loadgen/request_metrics.h"
#include "loadgen/workload.h"

namespace k3::loadgen {

struct RunOptions {
  std::string mode = "concurrency";  // concurrency | rate
  int64_t concurrency = 1;           // concurrency: workers; rate: most sessions in flight (0: any)
  double request_rate = 0;           // rate: sessions per second (Poisson arrivals; inf: all at once)
  int64_t warmup_requests = 1;       // sent one by one before the run, not measured
  double max_duration_s = 0;         // > 0: no request starts after this many seconds
  uint64_t seed = 0;                 // arrival times
  double progress_s = 0;             // > 0: a progress line on stderr this often (not recorded)
  nlohmann::json to_json() const;
  void validate() const;
};

struct RunResult {
  std::vector<RequestSample> samples;  // measured requests, in completion order
  double duration_s = 0;               // first request sent to last reply ended
  int64_t warmup_failed = 0;
  bool hit_time_limit = false;                                  // some planned request never started
  std::map<std::string, double> metrics_before, metrics_after;  // empty when /metrics failed
  std::string metrics_error;
};

// When each session starts in rate mode, in seconds from the run's start: a session's trace
// timestamp where it has one (arrival_s >= 0), else the previous arrival plus an exponential gap
// of mean 1 / rate (a Poisson process; rate = inf: all at once). Same seed, same times.
std::vector<double> arrival_times(const std::vector<Session>& sessions, double rate, uint64_t seed);

RunResult run_load(const Endpoint& endpoint, const std::vector<Session>& sessions, const RunOptions& options);

}  // namespace k3::loadgen
