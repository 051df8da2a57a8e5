// server/metrics.h: GET /metrics, Prometheus text format 0.0.4, with vLLM's metric names
// (the "vllm:" prefix and all) so dashboards and alerts written for vLLM work unchanged; every
// series vLLM's published Grafana dashboard queries is here (testdata/vllm_dashboard_metrics.txt
// lists them, with where the list came from, and metrics_test.cpp checks the page against it):
//   vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (also under its old
//   name vllm:time_per_output_token_seconds, which the dashboard queries),
//   vllm:e2e_request_latency_seconds, vllm:request_{queue,prefill,decode,inference}_time_seconds,
//   vllm:request_time_per_output_token_seconds, vllm:request_{prompt,generation}_tokens,
//   vllm:request_params_max_tokens, vllm:request_params_n, vllm:request_max_num_generation_tokens,
//   vllm:iteration_tokens_total (a histogram despite the name, as in vLLM)   histograms
//   vllm:prompt_tokens_total, vllm:generation_tokens_total,
//   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens),
//   vllm:num_preemptions_total, vllm:request_success_total{finished_reason} counters
//   vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (and its old
//   name vllm:gpu_cache_usage_perc), vllm:cache_config_info (value 1, the config as labels) gauges
//   with speculative decoding on: vllm:spec_decode_num_drafts_total,
//   vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total,
//   vllm:spec_decode_num_accepted_tokens_per_pos_total{position} counters, and
//   k3serve:spec_decode_synthetic{method} (1: forced synthetic acceptance, benchmarks only)
// Counters carry the "_total" suffix as vLLM's prometheus_client exposes them. Every sample
// has vLLM's labels engine="0" and model_name="<served model>". Things vLLM has no name for
// use the "k3serve:" prefix (requests per API front end, ignored request fields, client
// disconnects, malformed tool calls, HTTP errors, decode paths).
//
// Histograms are observed per choice (one engine request) on the engine's step thread, from
// the events as they arrive (request_params_n and request_max_num_generation_tokens once per
// prompt, when its n choices have all finished, as vLLM does per parent request); token
// counters, gauges and the tokens-per-step histogram are read from Engine::stats() at scrape
// time, so they cannot drift from the engine's own accounting. Bucket bounds are vLLM's.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/cache_config.h"
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
  // At most this many distinct (api, field) pairs are named by ignored_request_fields_total;
  // field names come from clients, so later ones are counted as field="other".
  static constexpr size_t kMaxIgnoredFields = 256;
  static constexpr size_t kMaxFieldNameBytes = 64;  // longer names are cut (at a UTF-8 boundary)

  // max_model_len: where vLLM's 1-2-5 token-count buckets end (its build_1_2_5_buckets);
  // cache: the sized cache config, shown as vllm:cache_config_info's labels.
  Metrics(std::string model_name, int64_t max_model_len, const cache::CacheConfig& cache);

  void observe_ttft(double seconds) { ttft_.observe(seconds); }
  void observe_inter_token(double seconds) { itl_.observe(seconds); }
  void observe_e2e(double seconds) { e2e_.observe(seconds); }
  // One choice's final event: its phase times, token counts and time per output token from the
  // engine's stats; max_tokens as resolved for it (request_params_max_tokens; <= 0: not observed).
  void observe_finished(const engine::RequestStats& stats, int64_t max_tokens);
  // All n choices of one prompt have finished; max_generation_tokens: the most any of them made.
  void observe_prompt_finished(int n, int64_t max_generation_tokens);
  void count_finished(engine::FinishReason reason);
  // One request on an API front end: "completions", "chat_completions", "messages",
  // "messages_count_tokens", "responses" (those five are on the page from the start, at 0).
  void count_request(std::string_view api);
  // A field a client sent on `api` that has no effect here.
  void count_ignored_field(std::string_view api, std::string_view field);
  void count_client_disconnect();
  void count_tool_parse_error();
  void count_http_error(int status);

  std::string render(const engine::EngineStats& stats) const;

 private:
  std::string labels_;             // engine="0",model_name="..."
  std::string cache_info_labels_;  // labels_ plus the cache config
  Histogram ttft_, itl_, e2e_;
  Histogram queue_, prefill_, decode_, inference_, tpot_request_;
  Histogram prompt_tokens_, generation_tokens_, max_tokens_param_, n_param_, max_generation_tokens_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> finished_;                                // finished_reason -> count
  std::map<int, int64_t> http_errors_;                                     // status -> count
  std::map<std::string, int64_t, std::less<>> api_requests_;               // api -> count
  std::map<std::pair<std::string, std::string>, int64_t> ignored_fields_;  // (api, field) -> count
  size_t named_ignored_fields_ = 0;  // entries of ignored_fields_ other than field="other"
  int64_t disconnects_ = 0, tool_parse_errors_ = 0;
};

// Label value escaping (\\, \", \n) per the text format.
std::string prometheus_label_value(const std::string& v);

}  // namespace k3::server
