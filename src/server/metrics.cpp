// server/metrics.cpp: histograms and the /metrics page.
#include "server/metrics.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace k3::server {

namespace {

// A number as vLLM's prometheus_client writes it (floatToGoString), sample values and le bounds
// alike, so a bucket reads le="0.3" as vLLM's does and both land in one series under
// sum by (le): Python's repr (the shortest digits that read back exactly; an exponent below
// 1e-4 and from 1e16), then Go's exponent from 1e6 up, written as Python does ("1e+06").
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // -?d(.d+)?e[+-]dd
  const bool negative = sci.front() == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(negative ? 1 : 0, e - (negative ? 1 : 0)))
    if (c != '.') digits += c;
  const int exp = std::stoi(std::string(sci.substr(e + 1)));
  std::string s = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {  // repr's exponent form: d[.ddd]e+XX, at least two exponent digits
    s += digits.substr(0, 1);
    if (digits.size() > 1) s += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return s + tail;
  }
  if (exp < 0) return s + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const auto whole = static_cast<size_t>(exp) + 1;
  std::string int_part = digits.substr(0, std::min(whole, digits.size()));
  if (digits.size() < whole) int_part.append(whole - digits.size(), '0');
  const std::string frac = digits.size() > whole ? digits.substr(whole) : "0";
  if (v > 0 && int_part.size() > 6) {  // Go's exponent: mantissa without trailing zeros or dot
    std::string mantissa = int_part.substr(0, 1) + "." + int_part.substr(1) + frac;
    while (!mantissa.empty() && (mantissa.back() == '0' || mantissa.back() == '.')) mantissa.pop_back();
    return mantissa + "e+0" + std::to_string(int_part.size() - 1);  // prometheus_client's "e+0" literally
  }
  return s + int_part + "." + frac;
}

void family(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + number(v) + "\n";
}

// The _bucket lines (cumulative[i]: observations <= bounds[i]; +Inf: count), _sum and _count.
void histogram_lines(std::string& out, const std::string& name, const std::string& labels,
                     const std::vector<double>& bounds, const std::vector<uint64_t>& cumulative, double sum,
                     uint64_t count) {
  for (size_t i = 0; i <= bounds.size(); ++i) {
    const std::string le = i < bounds.size() ? number(bounds[i]) : "+Inf";
    const uint64_t n = i < bounds.size() ? cumulative[i] : count;
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + number(static_cast<double>(n)) + "\n";
  }
  sample(out, name + "_sum", labels, sum);
  sample(out, name + "_count", labels, static_cast<double>(count));
}

// Bucket bounds (seconds) from vLLM's, so quantiles line up with vLLM dashboards.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
// vLLM's request_latency_buckets: e2e, queue, prefill, decode and inference time.
const std::vector<double> kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kNBuckets = {1, 2, 5, 10, 20};
// vllm:iteration_tokens_total's bounds, all powers of two (EngineStats::step_tokens_log2 folds into them).
constexpr int64_t kStepTokenBounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
static_assert(std::ranges::all_of(kStepTokenBounds,
                                  [](int64_t b) { return std::has_single_bit(static_cast<uint64_t>(b)); }));
static_assert(std::bit_width(uint64_t{16384}) - 1 == engine::EngineStats::kStepTokenBuckets - 2,
              "the engine's last bounded bucket (2^14 tokens) is vLLM's last bound; the one after holds the rest");

// vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... up to max_value.
std::vector<double> buckets_1_2_5(int64_t max_value) {
  std::vector<double> out;
  for (int64_t scale = 1;; scale *= 10)
    for (int64_t m : {1, 2, 5}) {
      if (m * scale > max_value) return out;
      out.push_back(static_cast<double>(m * scale));
    }
}

// At most `max` bytes of `s`, not splitting a UTF-8 sequence (label values must be UTF-8).
std::string_view utf8_prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // s[n] continues a sequence
  return s.substr(0, n);
}

double seconds_between(scheduler::Clock::time_point a, scheduler::Clock::time_point b) {
  if (a == scheduler::Clock::time_point{} || b == scheduler::Clock::time_point{}) return 0.0;
  return std::max(0.0, std::chrono::duration<double>(b - a).count());
}

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
  std::vector<uint64_t> cumulative(bounds_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) cumulative[i] = running += counts_[i];
  histogram_lines(out, name, labels, bounds_, cumulative, sum_, count_);
}

Metrics::Metrics(std::string model_name, int64_t max_model_len, const cache::CacheConfig& cache)
    : labels_("engine=\"0\",model_name=\"" + prometheus_label_value(model_name) + "\""),
      ttft_(kTtftBuckets),
      itl_(kItlBuckets),
      e2e_(kE2eBuckets),
      queue_(kE2eBuckets),
      prefill_(kE2eBuckets),
      decode_(kE2eBuckets),
      inference_(kE2eBuckets),
      tpot_request_(kItlBuckets),
      prompt_tokens_(buckets_1_2_5(max_model_len)),
      generation_tokens_(buckets_1_2_5(max_model_len)),
      max_tokens_param_(buckets_1_2_5(max_model_len)),
      n_param_(kNBuckets),
      max_generation_tokens_(buckets_1_2_5(max_model_len)) {
  // vLLM's label names where it has the field (num_gpu_blocks, block_size, enable_prefix_caching,
  // with Python's True/False), K3's own (KDA state slots and checkpoints) under the config's names.
  const auto q = [](int64_t v) {
    std::string s(1, '"');
    return s.append(std::to_string(v)).append(1, '"');
  };
  cache_info_labels_ = labels_ + ",block_size=" + q(cache.block_size) + ",num_gpu_blocks=" + q(cache.num_blocks) +
                       ",enable_prefix_caching=\"" + (cache.enable_prefix_cache ? "True" : "False") + "\"" +
                       ",num_slots=" + q(cache.num_slots) + ",num_checkpoints=" + q(cache.num_checkpoints) +
                       ",checkpoint_interval_blocks=" + q(cache.checkpoint_interval_blocks);
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
  for (const char* api : {"completions", "chat_completions", "messages", "messages_count_tokens", "responses"})
    api_requests_[api] = 0;
}

// vLLM's FinishedRequestStats: queued = first scheduled - arrival; prefill = first token - first
// scheduled; decode = last token - first token; inference = last token - first scheduled (each
// including any preemption inside it); time per output token = decode / (tokens - 1), 0 for one
// token. The engine's `finished` is stamped with the last token.
void Metrics::observe_finished(const engine::RequestStats& s, int64_t max_tokens) {
  const double decode = seconds_between(s.first_token, s.finished);
  queue_.observe(seconds_between(s.arrival, s.first_scheduled));
  prefill_.observe(seconds_between(s.first_scheduled, s.first_token));
  decode_.observe(decode);
  inference_.observe(seconds_between(s.first_scheduled, s.finished));
  tpot_request_.observe(s.output_tokens > 1 ? decode / static_cast<double>(s.output_tokens - 1) : 0.0);
  prompt_tokens_.observe(static_cast<double>(s.prompt_tokens));
  generation_tokens_.observe(static_cast<double>(s.output_tokens));
  if (max_tokens > 0) max_tokens_param_.observe(static_cast<double>(max_tokens));
}

void Metrics::observe_prompt_finished(int n, int64_t max_generation_tokens) {
  n_param_.observe(n);
  max_generation_tokens_.observe(static_cast<double>(max_generation_tokens));
}

void Metrics::count_request(std::string_view api) {
  std::lock_guard lock(mu_);
  auto it = api_requests_.find(api);
  if (it == api_requests_.end()) it = api_requests_.emplace(std::string(api), 0).first;
  ++it->second;
}

void Metrics::count_ignored_field(std::string_view api, std::string_view field) {
  std::pair<std::string, std::string> key(api, utf8_prefix(field, kMaxFieldNameBytes));
  std::lock_guard lock(mu_);
  auto it = ignored_fields_.find(key);
  if (it == ignored_fields_.end()) {
    if (named_ignored_fields_ < kMaxIgnoredFields) {
      it = ignored_fields_.emplace(std::move(key), 0).first;
      ++named_ignored_fields_;
    } else {
      key.second = "other";
      it = ignored_fields_.try_emplace(std::move(key), 0).first;
    }
  }
  ++it->second;
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
  const double kv_usage = s.cache.blocks_total > 0 ? static_cast<double>(s.cache.blocks_in_use) / s.cache.blocks_total
                                                   : 0.0;
  family(out, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  sample(out, "vllm:kv_cache_usage_perc", labels_, kv_usage);
  // vLLM's name before 0.9; its published dashboard still queries it.
  family(out, "vllm:gpu_cache_usage_perc", "gauge",
         "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.");
  sample(out, "vllm:gpu_cache_usage_perc", labels_, kv_usage);
  family(out, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  sample(out, "vllm:cache_config_info", cache_info_labels_, 1.0);
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
      sample(out, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
             labels_ + ",position=\"" + std::to_string(i) + "\"", static_cast<double>(s.spec_accepted_per_pos[i]));
    family(out, "k3serve:spec_decode_gated_steps_total", "counter",
           "Decode steps run without drafts because drafting was measured not to pay at that batch.");
    sample(out, "k3serve:spec_decode_gated_steps_total", labels_, static_cast<double>(s.spec_gated_steps));
    // Synthetic acceptance (benchmarks) is forced, not measured: say so on the page.
    family(out, "k3serve:spec_decode_synthetic", "gauge",
           "1 when acceptance is SYNTHETIC (forced acceptance length; outputs are not the model's distribution).");
    sample(out, "k3serve:spec_decode_synthetic", labels_ + ",method=\"" + prometheus_label_value(s.spec_method) + "\"",
           s.spec_synthetic ? 1.0 : 0.0);
  }
  family(out, "k3serve:model_steps_total", "counter",
         "Model steps by the path that ran them (decode_backend latency_specialized: fused or standard).");
  sample(out, "k3serve:model_steps_total", labels_ + ",path=\"fused\"",
         static_cast<double>(s.decode_paths.fused_steps));
  sample(out, "k3serve:model_steps_total", labels_ + ",path=\"standard\"",
         static_cast<double>(s.decode_paths.standard_steps));
  family(out, "k3serve:decode_fallbacks_total", "counter",
         "Steps the latency_specialized path left to the standard path, by reason.");
  for (const auto& [reason, n] : s.decode_paths.fallbacks)
    sample(out, "k3serve:decode_fallbacks_total", labels_ + ",reason=\"" + prometheus_label_value(reason) + "\"",
           static_cast<double>(n));
  // Shadow validation (--shadow-validate-rate): the fused steps that also ran the standard path.
  const engine::ShadowCounters& sh = s.shadow;
  family(out, "k3serve:shadow_steps_total", "counter",
         "Fused decode steps that also ran the standard path for comparison (--shadow-validate-rate).");
  sample(out, "k3serve:shadow_steps_total", labels_, static_cast<double>(sh.steps));
  family(out, "k3serve:shadow_divergent_steps_total", "counter",
         "Shadow-validated steps with a logits row outside the bf16 tolerance (logged with shapes and kernels).");
  sample(out, "k3serve:shadow_divergent_steps_total", labels_, static_cast<double>(sh.divergent_steps));
  family(out, "k3serve:shadow_rows_total", "counter", "Logits rows compared by shadow validation.");
  sample(out, "k3serve:shadow_rows_total", labels_, static_cast<double>(sh.rows));
  family(out, "k3serve:shadow_divergent_rows_total", "counter", "Compared rows outside the tolerance.");
  sample(out, "k3serve:shadow_divergent_rows_total", labels_, static_cast<double>(sh.divergent_rows));
  family(out, "k3serve:shadow_top1_disagreements_total", "counter",
         "Compared rows whose top-1 token differs between the paths (near ties included).");
  sample(out, "k3serve:shadow_top1_disagreements_total", labels_, static_cast<double>(sh.top1_disagreements));
  family(out, "k3serve:shadow_min_cosine", "gauge", "The lowest logits cosine of any compared row (1: none compared).");
  sample(out, "k3serve:shadow_min_cosine", labels_, sh.min_cosine);
  family(out, "k3serve:shadow_max_abs_rel", "gauge",
         "The largest |fused - standard| logit difference over its row's largest |logit|, over the compared rows.");
  sample(out, "k3serve:shadow_max_abs_rel", labels_, sh.max_abs_rel);
  family(out, "k3serve:shadow_seconds_total", "counter",
         "Time the shadow steps took; their cost is this over k3serve:model_step_seconds_total.");
  sample(out, "k3serve:shadow_seconds_total", labels_, sh.seconds);
  family(out, "k3serve:model_step_seconds_total", "counter", "Time in model steps (shadow steps included).");
  sample(out, "k3serve:model_step_seconds_total", labels_, s.executor_seconds);
  {
    std::lock_guard lock(mu_);
    family(out, "vllm:request_success_total", "counter", "Count of finished requests, by finish reason.");
    for (const auto& [reason, n] : finished_)
      sample(out, "vllm:request_success_total", labels_ + ",finished_reason=\"" + reason + "\"",
             static_cast<double>(n));
    family(out, "k3serve:client_disconnects_total", "counter", "Requests aborted because the client went away.");
    sample(out, "k3serve:client_disconnects_total", labels_, static_cast<double>(disconnects_));
    family(out, "k3serve:tool_call_parse_errors_total", "counter",
           "Malformed tool calls or markup in model output (dropped, not returned as tool_calls).");
    sample(out, "k3serve:tool_call_parse_errors_total", labels_, static_cast<double>(tool_parse_errors_));
    family(out, "k3serve:http_errors_total", "counter", "Error replies, by HTTP status.");
    for (const auto& [status, n] : http_errors_)
      sample(out, "k3serve:http_errors_total", labels_ + ",status=\"" + std::to_string(status) + "\"",
             static_cast<double>(n));
    family(out, "k3serve:api_requests_total", "counter", "Requests received, by API front end.");
    for (const auto& [api, n] : api_requests_)
      sample(out, "k3serve:api_requests_total", labels_ + ",api=\"" + prometheus_label_value(api) + "\"",
             static_cast<double>(n));
    family(out, "k3serve:ignored_request_fields_total", "counter",
           "Request fields a client sent that have no effect here, by API front end and field "
           "(at most 256 fields are named; the rest count as field=\"other\").");
    for (const auto& [key, n] : ignored_fields_)
      sample(out, "k3serve:ignored_request_fields_total",
             labels_ + ",api=\"" + prometheus_label_value(key.first) + "\",field=\"" +
                 prometheus_label_value(key.second) + "\"",
             static_cast<double>(n));
  }
  family(out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  ttft_.render("vllm:time_to_first_token_seconds", labels_, out);
  family(out, "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  itl_.render("vllm:inter_token_latency_seconds", labels_, out);
  // The same observations under vLLM's older (now deprecated) name, which its published dashboard queries.
  family(out, "vllm:time_per_output_token_seconds", "histogram",
         "Histogram of time per output token in seconds. DEPRECATED: Use vllm:inter_token_latency_seconds instead.");
  itl_.render("vllm:time_per_output_token_seconds", labels_, out);
  family(out, "vllm:request_time_per_output_token_seconds", "histogram",
         "Histogram of time_per_output_token_seconds per request.");
  tpot_request_.render("vllm:request_time_per_output_token_seconds", labels_, out);
  family(out, "vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.");
  e2e_.render("vllm:e2e_request_latency_seconds", labels_, out);
  family(out, "vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.");
  queue_.render("vllm:request_queue_time_seconds", labels_, out);
  family(out, "vllm:request_prefill_time_seconds", "histogram",
         "Histogram of time spent in PREFILL phase for request.");
  prefill_.render("vllm:request_prefill_time_seconds", labels_, out);
  family(out, "vllm:request_decode_time_seconds", "histogram", "Histogram of time spent in DECODE phase for request.");
  decode_.render("vllm:request_decode_time_seconds", labels_, out);
  family(out, "vllm:request_inference_time_seconds", "histogram",
         "Histogram of time spent in RUNNING phase for request.");
  inference_.render("vllm:request_inference_time_seconds", labels_, out);
  family(out, "vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.");
  prompt_tokens_.render("vllm:request_prompt_tokens", labels_, out);
  family(out, "vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.");
  generation_tokens_.render("vllm:request_generation_tokens", labels_, out);
  family(out, "vllm:request_params_max_tokens", "histogram", "Histogram of the max_tokens request parameter.");
  max_tokens_param_.render("vllm:request_params_max_tokens", labels_, out);
  family(out, "vllm:request_params_n", "histogram", "Histogram of the n request parameter.");
  n_param_.render("vllm:request_params_n", labels_, out);
  family(out, "vllm:request_max_num_generation_tokens", "histogram",
         "Histogram of maximum number of requested generation tokens.");
  max_generation_tokens_.render("vllm:request_max_num_generation_tokens", labels_, out);
  {
    // The engine's power-of-two step histogram, folded into vLLM's bounds (all powers of two):
    // le=2^k holds every step of at most 2^k tokens, i.e. engine buckets 0..k.
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;
    uint64_t steps = 0;
    for (int64_t n : s.step_tokens_log2) steps += static_cast<uint64_t>(n);
    for (int64_t b : kStepTokenBounds) {
      const auto k = static_cast<size_t>(std::bit_width(static_cast<uint64_t>(b)) - 1);
      uint64_t n = 0;
      for (size_t i = 0; i <= k; ++i) n += static_cast<uint64_t>(s.step_tokens_log2[i]);
      bounds.push_back(static_cast<double>(b));
      cumulative.push_back(n);
    }
    family(out, "vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.");
    histogram_lines(out, "vllm:iteration_tokens_total", labels_, bounds, cumulative,
                    static_cast<double>(s.prefill_tokens + s.decode_tokens), steps);
  }
  {
    // Host time per model step: the engine's power-of-two microsecond buckets, le in seconds.
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;
    uint64_t steps = 0;
    for (size_t i = 0; i + 1 < engine::EngineStats::kStepHostBuckets; ++i) {
      steps += static_cast<uint64_t>(s.step_host_us_log2[i]);
      bounds.push_back(static_cast<double>(uint64_t{1} << i) * 1e-6);
      cumulative.push_back(steps);
    }
    steps += static_cast<uint64_t>(s.step_host_us_log2.back());
    family(out, "k3serve:step_host_seconds", "histogram",
           "Host time per model step outside the model (scheduling, sampling, event delivery).");
    histogram_lines(out, "k3serve:step_host_seconds", labels_, bounds, cumulative, s.step_host_seconds, steps);
  }
  return out;
}

}  // namespace k3::server
