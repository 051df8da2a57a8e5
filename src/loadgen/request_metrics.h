// loadgen/request_metrics.h: one request's measured timeline and the run summary, with the
// metric definitions of vLLM's `bench serve` (benchmarks/serve.py, calculate_metrics):
//
//   TTFT  first streamed token chunk - request sent
//   E2E   last byte of the response - request sent ("latency")
//   TPOT  (E2E - TTFT) / (output tokens - 1), for requests with more than one output token
//   ITL   the gaps between successive streamed token chunks (every gap of every request)
//   throughput   completed requests, output tokens, input + output tokens per second of the run
//   goodput      requests/s meeting every SLO (TTFT, TPOT, E2E in ms; TPOT of a 1-token reply is 0)
//   interactivity  per-user tokens/s: 1000 / TPOT(ms) per request, and 1 / ITL per gap
//
// Percentiles are numpy's linear interpolation (stats.h). Beyond vLLM: prefill and decode
// throughput apart, each over the wall time in which at least one request was in that phase
// (the union of [sent, first token] intervals, and of [first token, end] intervals).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadgen/stats.h"

namespace k3::loadgen {

struct RequestSample {
  int64_t session = 0;                 // session index in the workload (one per request for single-turn kinds)
  int64_t turn = 0;                    // turn within the session
  int64_t input_tokens = 0;            // prompt tokens sent (exact: token-id prompts)
  int64_t output_tokens = 0;           // from the usage chunk, else the number of token chunks
  int64_t cached_tokens = -1;          // usage.prompt_tokens_details.cached_tokens; -1: not reported
  int64_t expected_output_tokens = 0;  // max_tokens asked for (ignore_eos: the exact length)
  double start_s = 0;                  // request sent, seconds since the run started
  double ttft_s = 0;                   // 0 when no token arrived
  double e2e_s = 0;
  std::vector<double> itl_s;  // gaps between successive token chunks (chunks - 1 values)
  bool ok = false;
  std::string error;  // why not ok (HTTP status and body, or the transport error)
  nlohmann::json to_json() const;
  static RequestSample from_json(const nlohmann::json& j);
};

// Service-level objectives for goodput, in milliseconds; an absent one always holds.
struct Slos {
  std::optional<double> ttft_ms, tpot_ms, e2e_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2e_ms; }
  nlohmann::json to_json() const;
  static Slos from_json(const nlohmann::json& j);
};
// "ttft:500" "tpot:50" "e2e:3000" (vLLM's --goodput KEY:VALUE, ms); throws core::Error naming
// the bad item.
Slos parse_slos(const std::vector<std::string>& items);
// Does one successful request meet every SLO?
bool meets_slos(const RequestSample& s, const Slos& slos);

// TPOT of one request in seconds; nullopt for failed requests and replies of <= 1 token.
std::optional<double> request_tpot(const RequestSample& s);

struct ServingSummary {
  int64_t completed = 0, failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0, total_cached_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  double request_goodput = 0;
  int64_t good_requests = 0;
  double prefill_throughput = 0, decode_throughput = 0;  // tokens/s over phase-busy wall time
  double prefill_busy_s = 0, decode_busy_s = 0;
  double client_prefix_hit_rate = 0;  // sum(cached) / sum(input) over requests that report it
  // In milliseconds except the interactivity ones (tokens/s per user).
  Distribution ttft_ms, tpot_ms, itl_ms, e2e_ms, interactivity_tpot, interactivity_itl;
  nlohmann::json to_json() const;
};
// duration_s: the benchmark's wall time (first request sent to last response ended).
ServingSummary summarize_run(const std::vector<RequestSample>& samples, double duration_s, const Slos& slos);

// Length of the union of [begin, end) intervals.
double union_length(std::vector<std::pair<double, double>> intervals);

}  // namespace k3::loadgen
