// server/metrics.h: GET /metrics, Prometheus text format 0.0.4, with vLLM's metric names
// (the "vllm:" prefix and all) so dashboards and alerts written for vLLM work unchanged:
//   vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
//   vllm:e2e_request_latency_seconds                                        histograms
//   vllm:prompt_tokens_total, vllm:generation_tokens_total,
//   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens),
//   vllm:num_preemptions_total, vllm:request_success_total{finished_reason} counters
//   vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc gauges
//   with speculative decoding on: vllm:spec_decode_num_drafts_total,
//   vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total,
//   vllm:spec_decode_num_accepted_tokens_per_pos_total{position} counters, and
//   k3serve:spec_decode_synthetic{method} (1: forced synthetic acceptance, benchmarks only)
// Counters carry the "_total" suffix as vLLM's prometheus_client exposes them. Every sample
// has vLLM's labels engine="0" and model_name="<served model>". Things vLLM has no name for
// use the "k3serve:" prefix (client disconnects, malformed tool calls, HTTP errors).
//
// Histograms are observed per choice (one engine request) on the engine's step thread, from
// the events as they arrive; token counters and gauges are read from Engine::stats() at
// scrape time, so they cannot drift from the engine's own accounting.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace k3::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket (cumulative, le="+Inf" last), _sum and _count lines.
  void render(const std::string& name, const std::string& labels, std::string& out) const;
  uint64_t count() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  void count_finished(engine::FinishReason reason);
  void count_client_disconnect();
  void count_tool_parse_error();
  void count_http_error(int status);

  std::string render(const engine::EngineStats& stats) const;

 private:
  std::string labels_;  // engine="0",model_name="..."
  Histogram ttft_, itl_, e2e_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_;  // finished_reason -> count
  std::map<int, int64_t> http_errors_;       // status -> count
  int64_t disconnects_ = 0, tool_parse_errors_ = 0;
};

// Label value escaping (\\, \", \n) per the text format.
std::string prometheus_label_value(const std::string& v);

}  // namespace k3::server
