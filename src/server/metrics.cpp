// server/metrics.cpp: histograms and the /metrics page.
#include "server/metrics.h"

#include <cmath>
#include <cstdio>

namespace k3::server {

namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

void family(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + number(v) + "\n";
}

// Bucket bounds (seconds) from vLLM's, so quantiles line up with vLLM dashboards.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4,  0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
const std::vector<double> kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,  15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

std::string prometheus_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  if (std::isnan(value)) return;
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mu_);
  return count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string& out) const {
  std::lock_guard lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + number(static_cast<double>(cumulative)) + "\n";
  }
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, static_cast<double>(count_));
}

Metrics::Metrics(std::string model_name)
    : labels_("engine=\"0\",model_name=\"" + prometheus_label_value(model_name) + "\""),
      ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kE2eBuckets) {
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
}

void Metrics::count_finished(engine::FinishReason reason) {
  std::lock_guard lock(mu_);
  ++finished_[scheduler::to_string(reason)];
}

void Metrics::count_client_disconnect() {
  std::lock_guard lock(mu_);
  ++disconnects_;
}

void Metrics::count_tool_parse_error() {
  std::lock_guard lock(mu_);
  ++tool_parse_errors_;
}

void Metrics::count_http_error(int status) {
  std::lock_guard lock(mu_);
  ++http_errors_[status];
}

std::string Metrics::render(const engine::EngineStats& s) const {
  std::string out;
  out.reserve(8192);
  family(out, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
  sample(out, "vllm:num_requests_running", labels_, s.running);
  family(out, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  sample(out, "vllm:num_requests_waiting", labels_, s.waiting);
  family(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample(out, "vllm:kv_cache_usage_perc", labels_,
         s.cache.blocks_total > 0 ? static_cast<double>(s.cache.blocks_in_use) / s.cache.blocks_total : 0.0);
  family(out, "vllm:prefix_cache_queries_total", "counter",
         "Prefix cache queries, in terms of number of queried tokens.");
  sample(out, "vllm:prefix_cache_queries_total", labels_, static_cast<double>(s.prompt_tokens));
  family(out, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
  sample(out, "vllm:prefix_cache_hits_total", labels_, static_cast<double>(s.prefix_hit_tokens));
  family(out, "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.");
  sample(out, "vllm:num_preemptions_total", labels_, static_cast<double>(s.preemptions));
  family(out, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.");
  sample(out, "vllm:prompt_tokens_total", labels_, static_cast<double>(s.prompt_tokens));
  family(out, "vllm:generation_tokens_total", "counter", "Number of generation tokens processed.");
  sample(out, "vllm:generation_tokens_total", labels_, static_cast<double>(s.generated_tokens));
  if (!s.spec_method.empty()) {  // speculative decoding on (vLLM's spec_decode counters)
    family(out, "vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.");
    sample(out, "vllm:spec_decode_num_drafts_total", labels_, static_cast<double>(s.spec_num_drafts));
    family(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    sample(out, "vllm:spec_decode_num_draft_tokens_total", labels_, static_cast<double>(s.spec_num_draft_tokens));
    family(out, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.");
    sample(out, "vllm:spec_decode_num_accepted_tokens_total", labels_, static_cast<double>(s.spec_num_accepted_tokens));
    family(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Accepted tokens per draft position.");
    for (size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i)
      sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total", labels_ + ",position=\"" + std::to_string(i) + "\"",
             static_cast<double>(s.spec_accepted_per_pos[i]));
    // Synthetic acceptance (benchmarks) is forced, not measured: say so on the page.
    family(out, "k3serve:spec_decode_synthetic", "gauge",
           "1 when acceptance is SYNTHETIC (forced acceptance length; outputs are not the model's distribution).");
    sample(out, "k3serve:spec_decode_synthetic", labels_ + ",method=\"" + prometheus_label_value(s.spec_method) + "\"",
           s.spec_synthetic ? 1.0 : 0.0);
  }
  family(out, "k3serve:model_steps_total", "counter",
         "Model steps by the path that ran them (decode_backend latency_specialized: fused or standard).");
  sample(out, "k3serve:model_steps_total", labels_ + ",path=\"fused\"", static_cast<double>(s.decode_paths.fused_steps));
  sample(out, "k3serve:model_steps_total", labels_ + ",path=\"standard\"",
         static_cast<double>(s.decode_paths.standard_steps));
  family(out, "k3serve:decode_fallbacks_total", "counter",
         "Steps the latency_specialized path left to the standard path, by reason.");
  for (const auto& [reason, n] : s.decode_paths.fallbacks)
    sample(out, "k3serve:decode_fallbacks_total", labels_ + ",reason=\"" + prometheus_label_value(reason) + "\"",
           static_cast<double>(n));
  {
    std::lock_guard lock(mu_);
    family(out, "vllm:request_success_total", "counter", "Count of finished requests, by finish reason.");
    for (const auto& [reason, n] : finished_)
      sample(out, "vllm:request_success_total", labels_ + ",finished_reason=\"" + reason + "\"", static_cast<double>(n));
    family(out, "k3serve:client_disconnects_total", "counter", "Requests aborted because the client went away.");
    sample(out, "k3serve:client_disconnects_total", labels_, static_cast<double>(disconnects_));
    family(out, "k3serve:tool_call_parse_errors_total", "counter",
           "Malformed tool calls or markup in model output (dropped, not returned as tool_calls).");
    sample(out, "k3serve:tool_call_parse_errors_total", labels_, static_cast<double>(tool_parse_errors_));
    family(out, "k3serve:http_errors_total", "counter", "Error replies, by HTTP status.");
    for (const auto& [status, n] : http_errors_)
      sample(out, "k3serve:http_errors_total", labels_ + ",status=\"" + std::to_string(status) + "\"",
             static_cast<double>(n));
  }
  family(out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  ttft_.render("vllm:time_to_first_token_seconds", labels_, out);
  family(out, "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  itl_.render("vllm:inter_token_latency_seconds", labels_, out);
  family(out, "vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.");
  e2e_.render("vllm:e2e_request_latency_seconds", labels_, out);
  return out;
}

}  // namespace k3::server
