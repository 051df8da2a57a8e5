// server/metrics_test.cpp: the /metrics page: vLLM's names and types (every metric vLLM's
// Grafana dashboard queries, from testdata/vllm_dashboard_metrics.txt), cumulative histogram
// buckets with sum and count, the per-request histograms' values, counters read from the
// engine's stats, the engine's tokens per step folded into vLLM's buckets, requests per API and
// ignored fields (bounded), label escaping; and one run through a real Engine and Generation.
#include "server/metrics.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/fake_executor.h"
#include "server/generation.h"

namespace k3::server {
namespace {

bool has_line(const std::string& page, const std::string& line) {
  return page.find("\n" + line + "\n") != std::string::npos || page.rfind(line + "\n", 0) == 0;
}

// The value of the sample line that starts with `series` (name{labels}); NaN when absent.
double value_of(const std::string& page, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = page.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::stod(page.substr(at + key.size(), page.find('\n', at + key.size()) - at - key.size()));
}

cache::CacheConfig test_cache() {
  cache::CacheConfig c;
  c.block_size = 16;
  c.num_blocks = 1000;
  c.num_slots = 8;
  c.num_checkpoints = 32;
  c.checkpoint_interval_blocks = 4;
  c.enable_prefix_cache = true;
  return c;
}

Metrics make_metrics(const std::string& model = "k3-tiny") { return Metrics(model, 4096, test_cache()); }

const std::string kL = "{engine=\"0\",model_name=\"k3-tiny\"";  // a sample's labels, open

// A request's stats with exact phase times: queued 0.25 s, prefill 1 s, decode 3 s.
engine::RequestStats finished_stats(int64_t prompt_tokens, int64_t output_tokens) {
  engine::RequestStats s;
  s.arrival = scheduler::Clock::now();
  s.first_scheduled = s.arrival + std::chrono::milliseconds(250);
  s.first_token = s.first_scheduled + std::chrono::seconds(1);
  s.finished = s.first_token + std::chrono::seconds(3);
  s.prompt_tokens = prompt_tokens;
  s.output_tokens = output_tokens;
  return s;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 3.0}) h.observe(v);
  std::string out;
  h.render("x", "a=\"b\"", out);
  EXPECT_EQ(out,
            "x_bucket{a=\"b\",le=\"0.1\"} 2.0\n"
            "x_bucket{a=\"b\",le=\"1.0\"} 3.0\n"
            "x_bucket{a=\"b\",le=\"+Inf\"} 5.0\n"
            "x_sum{a=\"b\"} 5.65\n"
            "x_count{a=\"b\"} 5.0\n");
  EXPECT_EQ(h.count(), 5u);
}

// Bounds and values read as vLLM's prometheus_client writes them (Python's repr, then Go's
// exponent from 1e6 up), so le="0.3" here is the same label value as vLLM's.
TEST(Metrics, NumbersAreWrittenAsVllmWritesThem) {
  Histogram h({1e-5, 0.001, 0.3, 2560, 1e6, 12345678, 1e16});
  h.observe(0.25);
  std::string out;
  h.render("x", "a=\"b\"", out);
  for (const char* le : {"1e-05", "0.001", "0.3", "2560.0", "1e+06", "1.2345678e+07", "1e+16", "+Inf"})
    EXPECT_NE(out.find(std::string("le=\"") + le + "\"}"), std::string::npos) << le << "\n" << out;
  EXPECT_NE(out.find("x_sum{a=\"b\"} 0.25\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count{a=\"b\"} 1.0\n"), std::string::npos) << out;
}

TEST(Metrics, PageHasVllmNamesTypesAndEngineCounters) {
  Metrics m = make_metrics();
  m.observe_ttft(0.02);
  m.observe_inter_token(0.01);
  m.observe_e2e(0.5);
  m.count_finished(engine::FinishReason::length);
  m.count_http_error(400);
  engine::EngineStats s;
  s.running = 3;
  s.waiting = 2;
  s.prompt_tokens = 100;
  s.prefix_hit_tokens = 64;
  s.generated_tokens = 17;
  s.preemptions = 1;
  s.cache.blocks_total = 10;
  s.cache.blocks_in_use = 4;
  const std::string page = m.render(s);
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"}";
  EXPECT_TRUE(has_line(page, "# TYPE vllm:num_requests_running gauge"));
  EXPECT_TRUE(has_line(page, "vllm:num_requests_running" + l + " 3.0"));
  EXPECT_TRUE(has_line(page, "vllm:num_requests_waiting" + l + " 2.0"));
  EXPECT_TRUE(has_line(page, "# TYPE vllm:prompt_tokens_total counter"));
  EXPECT_TRUE(has_line(page, "vllm:prompt_tokens_total" + l + " 100.0"));
  EXPECT_TRUE(has_line(page, "vllm:generation_tokens_total" + l + " 17.0"));
  EXPECT_TRUE(has_line(page, "vllm:prefix_cache_queries_total" + l + " 100.0"));
  EXPECT_TRUE(has_line(page, "vllm:prefix_cache_hits_total" + l + " 64.0"));
  EXPECT_TRUE(has_line(page, "vllm:num_preemptions_total" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:kv_cache_usage_perc" + l + " 0.4"));
  EXPECT_TRUE(has_line(page, "# TYPE vllm:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has_line(page, "vllm:time_to_first_token_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:inter_token_latency_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:e2e_request_latency_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(
      has_line(page, "vllm:request_success_total{engine=\"0\",model_name=\"k3-tiny\",finished_reason=\"length\"} 1.0"));
  EXPECT_TRUE(has_line(page, "k3serve:http_errors_total{engine=\"0\",model_name=\"k3-tiny\",status=\"400\"} 1.0"));
  // Every sample line belongs to a family declared with # TYPE.
  size_t pos = 0;
  while (pos < page.size()) {
    const size_t end = page.find('\n', pos);
    const std::string line = page.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find('{'));
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.size() > std::strlen(suffix) && name.ends_with(suffix) &&
          page.find("# TYPE " + name.substr(0, name.size() - std::strlen(suffix)) + " histogram") != std::string::npos)
        name = name.substr(0, name.size() - std::strlen(suffix));
    EXPECT_NE(page.find("# TYPE " + name + " "), std::string::npos) << line;
  }
}

TEST(Metrics, LabelValuesAreEscaped) {
  EXPECT_EQ(prometheus_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Metrics m = make_metrics("we\"ird");
  EXPECT_NE(m.render({}).find("model_name=\"we\\\"ird\""), std::string::npos);
}

TEST(Metrics, SpeculativeDecodingCountersUseVllmNames) {
  Metrics m = make_metrics();
  engine::EngineStats s;
  const std::string off = m.render(s);
  EXPECT_EQ(off.find("spec_decode"), std::string::npos);  // speculation off: no spec families
  s.spec_method = "synthetic";
  s.spec_synthetic = true;
  s.spec_num_drafts = 5;
  s.spec_num_draft_tokens = 15;
  s.spec_num_accepted_tokens = 9;
  s.spec_accepted_per_pos = {5, 3, 1};
  s.spec_gated_steps = 4;
  const std::string page = m.render(s);
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"";
  EXPECT_TRUE(has_line(page, "# TYPE vllm:spec_decode_num_drafts_total counter"));
  EXPECT_TRUE(has_line(page, "vllm:spec_decode_num_drafts_total" + l + "} 5.0"));
  EXPECT_TRUE(has_line(page, "vllm:spec_decode_num_draft_tokens_total" + l + "} 15.0"));
  EXPECT_TRUE(has_line(page, "vllm:spec_decode_num_accepted_tokens_total" + l + "} 9.0"));
  EXPECT_TRUE(has_line(page, "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"));
  EXPECT_TRUE(has_line(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total" + l + ",position=\"0\"} 5.0"));
  EXPECT_TRUE(has_line(page, "vllm:spec_decode_num_accepted_tokens_per_pos_total" + l + ",position=\"2\"} 1.0"));
  EXPECT_TRUE(has_line(page, "k3serve:spec_decode_synthetic" + l + ",method=\"synthetic\"} 1.0"));
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:spec_decode_gated_steps_total counter"));
  EXPECT_TRUE(has_line(page, "k3serve:spec_decode_gated_steps_total" + l + "} 4.0"));
}

// decode_backend latency_specialized: steps per path and fallbacks by reason.
TEST(Metrics, DecodePathCountersNameThePathAndTheFallbackReason) {
  Metrics m = make_metrics();
  engine::EngineStats s;
  s.decode_paths.fused_steps = 40;
  s.decode_paths.standard_steps = 3;
  s.decode_paths.fallbacks = {{"prefill_or_mixed_step", 2}, {"more_than_64_rows", 1}};
  const std::string page = m.render(s);
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"";
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:model_steps_total counter"));
  EXPECT_TRUE(has_line(page, "k3serve:model_steps_total" + l + ",path=\"fused\"} 40.0"));
  EXPECT_TRUE(has_line(page, "k3serve:model_steps_total" + l + ",path=\"standard\"} 3.0"));
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:decode_fallbacks_total counter"));
  EXPECT_TRUE(has_line(page, "k3serve:decode_fallbacks_total" + l + ",reason=\"prefill_or_mixed_step\"} 2.0"));
  EXPECT_TRUE(has_line(page, "k3serve:decode_fallbacks_total" + l + ",reason=\"more_than_64_rows\"} 1.0"));
}

// --shadow-validate-rate: the shadow steps' comparisons and their cost.
TEST(Metrics, ShadowValidationCountersAndTheirCost) {
  Metrics m = make_metrics();
  engine::EngineStats s;
  s.shadow.steps = 7;
  s.shadow.divergent_steps = 1;
  s.shadow.rows = 21;
  s.shadow.divergent_rows = 2;
  s.shadow.top1_disagreements = 3;
  s.shadow.min_cosine = 0.5;
  s.shadow.max_abs_rel = 0.25;
  s.shadow.seconds = 0.75;
  s.executor_seconds = 12.5;
  const std::string page = m.render(s);
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"}";
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:shadow_steps_total counter"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_steps_total" + l + " 7.0"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_divergent_steps_total" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_rows_total" + l + " 21.0"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_divergent_rows_total" + l + " 2.0"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_top1_disagreements_total" + l + " 3.0"));
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:shadow_min_cosine gauge"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_min_cosine" + l + " 0.5"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_max_abs_rel" + l + " 0.25"));
  EXPECT_TRUE(has_line(page, "k3serve:shadow_seconds_total" + l + " 0.75"));
  EXPECT_TRUE(has_line(page, "k3serve:model_step_seconds_total" + l + " 12.5"));
}

// Host time per model step: the engine's power-of-two microsecond buckets, cumulative, in seconds.
TEST(Metrics, StepHostTimeIsAHistogramInSeconds) {
  Metrics m = make_metrics();
  engine::EngineStats s;
  s.step_host_us_log2[0] = 2;      // <= 1 us
  s.step_host_us_log2[5] = 3;      // 17..32 us
  s.step_host_us_log2.back() = 1;  // beyond 65.5 ms
  s.step_host_seconds = 0.5;
  const std::string page = m.render(s);
  const std::string l = "{engine=\"0\",model_name=\"k3-tiny\"";
  EXPECT_TRUE(has_line(page, "# TYPE k3serve:step_host_seconds histogram"));
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_bucket" + l + ",le=\"1e-06\"} 2.0")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_bucket" + l + ",le=\"1.6e-05\"} 2.0")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_bucket" + l + ",le=\"3.2e-05\"} 5.0")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_bucket" + l + ",le=\"0.065536\"} 5.0")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_bucket" + l + ",le=\"+Inf\"} 6.0")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_sum" + l + "} 0.5")) << page;
  EXPECT_TRUE(has_line(page, "k3serve:step_host_seconds_count" + l + "} 6.0")) << page;
}

// Every metric vLLM's published Grafana dashboard queries (and the loggers.py ones listed with
// them) is on the page under vLLM's name and type after one finished request, with samples
// carrying model_name, the label every dashboard query selects on.
TEST(Metrics, EveryMetricOfVllmsDashboardIsOnThePage) {
  const auto path = std::filesystem::path(K3_SOURCE_DIR) / "src/server/testdata/vllm_dashboard_metrics.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  Metrics m = make_metrics();
  m.observe_ttft(0.02);
  m.observe_inter_token(0.01);
  m.observe_e2e(4.25);
  m.observe_finished(finished_stats(100, 7), 200);
  m.observe_prompt_finished(1, 7);
  m.count_finished(engine::FinishReason::stop);
  engine::EngineStats s;
  s.prefill_tokens = 100;
  s.decode_tokens = 6;
  s.step_tokens_log2[0] = 6;  // six one-token decode steps
  s.step_tokens_log2[7] = 1;  // a 100-token prefill
  const std::string page = m.render(s);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, type, extra;
    ASSERT_TRUE(fields >> name >> type) << line;
    EXPECT_FALSE(fields >> extra) << line;
    ASSERT_TRUE(type == "counter" || type == "gauge" || type == "histogram") << line;
    if (type == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << name << ": counters are listed as exposed";
    }
    EXPECT_TRUE(has_line(page, "# TYPE " + name + " " + type)) << name;
    if (type == "histogram") {
      for (const char* suffix : {"_bucket{", "_sum{", "_count{"})
        EXPECT_NE(page.find("\n" + name + suffix + "engine=\"0\",model_name=\"k3-tiny\""), std::string::npos)
            << name << suffix;
      EXPECT_NE(page.find("\n" + name + "_bucket" + kL + ",le=\"+Inf\"} "), std::string::npos) << name;
      EXPECT_GE(value_of(page, name + "_count" + kL + "}"), 1.0) << name << ": observed once";
    } else {
      EXPECT_NE(page.find("\n" + name + "{engine=\"0\",model_name=\"k3-tiny\""), std::string::npos) << name;
    }
    ++checked;
  }
  EXPECT_GE(checked, 15) << "the dashboard queries 15 metrics";
}

TEST(Metrics, FinishedRequestHistogramsHoldVllmsPhaseTimesAndTokenCounts) {
  Metrics m = make_metrics();
  m.observe_finished(finished_stats(100, 7), 200);
  engine::RequestStats one = finished_stats(3, 1);  // one token: no decode, tpot 0
  one.finished = one.first_token;
  m.observe_finished(one, 0);  // max_tokens 0: not observed
  m.observe_prompt_finished(2, 7);
  const std::string page = m.render({});
  // queue 0.25 s, prefill 1 s, decode 3 s and inference 4 s (the one-token request: 0 s and 1 s).
  EXPECT_EQ(value_of(page, "vllm:request_queue_time_seconds_sum" + kL + "}"), 0.5);
  EXPECT_EQ(value_of(page, "vllm:request_queue_time_seconds_bucket" + kL + ",le=\"0.3\"}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_prefill_time_seconds_sum" + kL + "}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_prefill_time_seconds_bucket" + kL + ",le=\"0.8\"}"), 0.0);
  EXPECT_EQ(value_of(page, "vllm:request_prefill_time_seconds_bucket" + kL + ",le=\"1.0\"}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_decode_time_seconds_sum" + kL + "}"), 3.0);
  EXPECT_EQ(value_of(page, "vllm:request_decode_time_seconds_bucket" + kL + ",le=\"0.3\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_decode_time_seconds_bucket" + kL + ",le=\"2.5\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_decode_time_seconds_bucket" + kL + ",le=\"5.0\"}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_inference_time_seconds_sum" + kL + "}"), 5.0);
  EXPECT_EQ(value_of(page, "vllm:request_inference_time_seconds_count" + kL + "}"), 2.0);
  // Time per output token: 3 s over the 6 tokens after the first; the one-token request adds 0.
  EXPECT_EQ(value_of(page, "vllm:request_time_per_output_token_seconds_sum" + kL + "}"), 0.5);
  EXPECT_EQ(value_of(page, "vllm:request_time_per_output_token_seconds_bucket" + kL + ",le=\"0.01\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_time_per_output_token_seconds_bucket" + kL + ",le=\"0.5\"}"), 2.0);
  // Token counts on vLLM's 1-2-5 buckets up to max_model_len (4096: the last bound is 2000).
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_sum" + kL + "}"), 103.0);
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_bucket" + kL + ",le=\"5.0\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_bucket" + kL + ",le=\"50.0\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_bucket" + kL + ",le=\"100.0\"}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_bucket" + kL + ",le=\"2000.0\"}"), 2.0);
  EXPECT_EQ(page.find("vllm:request_prompt_tokens_bucket" + kL + ",le=\"5000.0\"}"), std::string::npos);
  EXPECT_EQ(value_of(page, "vllm:request_generation_tokens_sum" + kL + "}"), 8.0);
  EXPECT_EQ(value_of(page, "vllm:request_generation_tokens_bucket" + kL + ",le=\"1.0\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_max_tokens_count" + kL + "}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_max_tokens_sum" + kL + "}"), 200.0);
  // Once per prompt: its n and its longest choice.
  EXPECT_EQ(value_of(page, "vllm:request_params_n_count" + kL + "}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_n_bucket" + kL + ",le=\"1.0\"}"), 0.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_n_bucket" + kL + ",le=\"2.0\"}"), 1.0);
  EXPECT_EQ(value_of(page, "vllm:request_max_num_generation_tokens_sum" + kL + "}"), 7.0);
  EXPECT_EQ(value_of(page, "vllm:request_max_num_generation_tokens_bucket" + kL + ",le=\"5.0\"}"), 0.0);
  EXPECT_EQ(value_of(page, "vllm:request_max_num_generation_tokens_bucket" + kL + ",le=\"10.0\"}"), 1.0);
}

TEST(Metrics, OldVllmNamesCarryTheSameValuesAsTheNewOnes) {
  Metrics m = make_metrics();
  m.observe_inter_token(0.03);
  m.observe_inter_token(0.2);
  engine::EngineStats s;
  s.cache.blocks_total = 8;
  s.cache.blocks_in_use = 2;
  const std::string page = m.render(s);
  EXPECT_TRUE(has_line(page, "vllm:gpu_cache_usage_perc" + kL + "} 0.25"));
  EXPECT_TRUE(has_line(page, "vllm:kv_cache_usage_perc" + kL + "} 0.25"));
  for (const char* name : {"vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"}) {
    EXPECT_EQ(value_of(page, name + std::string("_count") + kL + "}"), 2.0) << name;
    EXPECT_EQ(value_of(page, name + std::string("_bucket") + kL + ",le=\"0.05\"}"), 1.0) << name;
    EXPECT_DOUBLE_EQ(value_of(page, name + std::string("_sum") + kL + "}"), 0.23) << name;
  }
}

// The engine's power-of-two step histogram folds into vLLM's bounds 1, 8, 16, ..., 16384.
TEST(Metrics, IterationTokensFoldTheEnginesStepsIntoVllmsBuckets) {
  Metrics m = make_metrics();
  engine::EngineStats s;
  s.step_tokens_log2[0] = 2;   // 1 token
  s.step_tokens_log2[2] = 1;   // 3..4 tokens
  s.step_tokens_log2[3] = 1;   // 5..8
  s.step_tokens_log2[4] = 1;   // 9..16
  s.step_tokens_log2[14] = 1;  // 8193..16384
  s.step_tokens_log2[15] = 1;  // more than 16384
  s.prefill_tokens = 30000;
  s.decode_tokens = 20;
  const std::string page = m.render(s);
  const std::string b = "vllm:iteration_tokens_total_bucket" + kL + ",le=";
  EXPECT_TRUE(has_line(page, "# TYPE vllm:iteration_tokens_total histogram"));
  EXPECT_EQ(value_of(page, b + "\"1.0\"}"), 2.0);
  EXPECT_EQ(value_of(page, b + "\"8.0\"}"), 4.0);
  EXPECT_EQ(value_of(page, b + "\"16.0\"}"), 5.0);
  EXPECT_EQ(value_of(page, b + "\"8192.0\"}"), 5.0);
  EXPECT_EQ(value_of(page, b + "\"16384.0\"}"), 6.0);
  EXPECT_EQ(value_of(page, b + "\"+Inf\"}"), 7.0);
  EXPECT_EQ(page.find(b + "\"2.0\"}"), std::string::npos);  // vLLM has no 2 or 4
  EXPECT_EQ(value_of(page, "vllm:iteration_tokens_total_count" + kL + "}"), 7.0);
  EXPECT_EQ(value_of(page, "vllm:iteration_tokens_total_sum" + kL + "}"), 30020.0);
}

TEST(Metrics, CacheConfigInfoIsOneWithTheConfigAsLabels) {
  const std::string page = make_metrics().render({});
  EXPECT_TRUE(has_line(page, "# TYPE vllm:cache_config_info gauge"));
  EXPECT_TRUE(has_line(page, "vllm:cache_config_info" + kL +
                                 ",block_size=\"16\",num_gpu_blocks=\"1000\",enable_prefix_caching=\"True\""
                                 ",num_slots=\"8\",num_checkpoints=\"32\",checkpoint_interval_blocks=\"4\"} 1.0"));
}

TEST(Metrics, RequestsAreCountedPerApi) {
  Metrics m = make_metrics();
  const std::string before = m.render({});
  EXPECT_TRUE(has_line(before, "# TYPE k3serve:api_requests_total counter"));
  for (const char* api : {"completions", "chat_completions", "messages", "messages_count_tokens", "responses"})
    EXPECT_TRUE(has_line(before, "k3serve:api_requests_total" + kL + ",api=\"" + api + "\"} 0.0")) << api;
  m.count_request("chat_completions");
  m.count_request("chat_completions");
  m.count_request("messages");
  m.count_request("new\"api");  // not one of the five: counted all the same, escaped
  const std::string page = m.render({});
  EXPECT_TRUE(has_line(page, "k3serve:api_requests_total" + kL + ",api=\"chat_completions\"} 2.0"));
  EXPECT_TRUE(has_line(page, "k3serve:api_requests_total" + kL + ",api=\"messages\"} 1.0"));
  EXPECT_TRUE(has_line(page, "k3serve:api_requests_total" + kL + ",api=\"completions\"} 0.0"));
  EXPECT_TRUE(has_line(page, "k3serve:api_requests_total" + kL + ",api=\"new\\\"api\"} 1.0"));
}

TEST(Metrics, IgnoredFieldsAreCountedPerApiAndField) {
  Metrics m = make_metrics();
  EXPECT_TRUE(has_line(m.render({}), "# TYPE k3serve:ignored_request_fields_total counter"));
  m.count_ignored_field("chat_completions", "user");
  m.count_ignored_field("chat_completions", "user");
  m.count_ignored_field("messages", "user");
  m.count_ignored_field("responses", "we\"ird\nname");
  const std::string page = m.render({});
  const std::string f = "k3serve:ignored_request_fields_total" + kL;
  EXPECT_TRUE(has_line(page, f + ",api=\"chat_completions\",field=\"user\"} 2.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"messages\",field=\"user\"} 1.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"responses\",field=\"we\\\"ird\\nname\"} 1.0"));
}

// Field names come from clients: at most 256 (api, field) pairs are named, the rest are
// counted as field="other" on their api, and long names are cut at a UTF-8 boundary.
TEST(Metrics, IgnoredFieldsAreBounded) {
  Metrics m = make_metrics();
  for (size_t i = 0; i < Metrics::kMaxIgnoredFields; ++i)
    m.count_ignored_field("responses", std::string("f").append(std::to_string(i)));
  m.count_ignored_field("responses", "one_too_many");
  m.count_ignored_field("messages", "another");
  m.count_ignored_field("messages", "and_another");
  m.count_ignored_field("responses", "f7");  // already named: still its own
  const std::string page = m.render({});
  const std::string f = "k3serve:ignored_request_fields_total" + kL;
  EXPECT_TRUE(has_line(page, f + ",api=\"responses\",field=\"f0\"} 1.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"responses\",field=\"f255\"} 1.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"responses\",field=\"f7\"} 2.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"responses\",field=\"other\"} 1.0"));
  EXPECT_TRUE(has_line(page, f + ",api=\"messages\",field=\"other\"} 2.0"));
  EXPECT_EQ(page.find("one_too_many"), std::string::npos);
  EXPECT_EQ(page.find("field=\"another\""), std::string::npos);
  size_t rows = 0;
  for (size_t at = page.find("\n" + f); at != std::string::npos; at = page.find("\n" + f, at + 1)) ++rows;
  EXPECT_EQ(rows, Metrics::kMaxIgnoredFields + 2);  // the named ones plus two "other" rows

  Metrics cut = make_metrics();
  // 63 ASCII bytes then a 2-byte character: cut before it, never inside.
  cut.count_ignored_field("responses", std::string(63, 'a') + "\xC3\xA9" + "tail");
  const std::string cut_page = cut.render({});
  EXPECT_TRUE(has_line(cut_page, f + ",api=\"responses\",field=\"" + std::string(63, 'a') + "\"} 1.0"));
}

// End to end: a real Engine (fake executor) under Generation, as the handlers run it: two
// prompts with n = 2 each. Per-choice histograms see four requests, n and the longest output
// one per prompt, and the engine's steps land in vllm:iteration_tokens_total.
TEST(Metrics, GenerationReportsEachChoiceAndEachPromptFromTheEngine) {
  engine::EngineConfig c;
  c.cache.block_size = 8;
  c.cache.num_blocks = 64;
  c.cache.num_slots = 6;
  c.cache.num_checkpoints = 16;
  c.cache.checkpoint_interval_blocks = 2;
  c.scheduler.max_num_seqs = 6;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.long_prefill_token_threshold = 32;
  c.scheduler.max_partial_prefills = 2;
  c.scheduler.max_model_len = 160;
  c.eos_token_id = 0;
  auto ex = std::make_unique<engine::testing::FakeExecutor>(c.cache, 64);
  engine::testing::FakeExecutor* fake = ex.get();
  engine::Engine eng(c, std::move(ex));
  fake->set_tokens_of([&](engine::RequestId id) { return eng.scheduler().find(id)->tokens(); });
  auto metrics = std::make_shared<Metrics>("k3-tiny", c.scheduler.max_model_len, c.cache);
  {
    Generation gen(eng, metrics);
    std::vector<engine::GenerateRequest> choices;
    for (int p = 0; p < 2; ++p)
      for (int k = 0; k < 2; ++k) {
        engine::GenerateRequest r;
        for (int i = 0; i < (p == 0 ? 20 : 12); ++i) r.prompt.push_back(1 + (i * 5 + p * 11) % 63);
        r.max_tokens = p == 0 ? 5 - k : 3;  // prompt 0's choices make 5 and 4 tokens, prompt 1's 3 and 3
        r.ignore_eos = true;
        choices.push_back(std::move(r));
      }
    gen.submit(std::move(choices), 2);
    eng.run_until_idle();
    ASSERT_TRUE(gen.engine_done());
  }
  const engine::EngineStats s = eng.stats();
  const std::string page = metrics->render(s);
  EXPECT_EQ(value_of(page, "vllm:request_generation_tokens_count" + kL + "}"), 4.0);
  EXPECT_EQ(value_of(page, "vllm:request_generation_tokens_sum" + kL + "}"), 15.0);
  EXPECT_EQ(value_of(page, "vllm:request_prompt_tokens_sum" + kL + "}"), 64.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_max_tokens_sum" + kL + "}"), 15.0);
  for (const char* h : {"vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                        "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
                        "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds"})
    EXPECT_EQ(value_of(page, h + std::string("_count") + kL + "}"), 4.0) << h;
  EXPECT_GT(value_of(page, "vllm:request_decode_time_seconds_sum" + kL + "}"), 0.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_n_count" + kL + "}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_params_n_sum" + kL + "}"), 4.0);
  EXPECT_EQ(value_of(page, "vllm:request_max_num_generation_tokens_count" + kL + "}"), 2.0);
  EXPECT_EQ(value_of(page, "vllm:request_max_num_generation_tokens_sum" + kL + "}"), 8.0);  // 5 + 3
  // Every step computed tokens: one observation per step, summing to the computed tokens.
  EXPECT_GT(s.steps, 0u);
  EXPECT_EQ(value_of(page, "vllm:iteration_tokens_total_count" + kL + "}"), static_cast<double>(s.steps));
  EXPECT_EQ(value_of(page, "vllm:iteration_tokens_total_sum" + kL + "}"),
            static_cast<double>(s.prefill_tokens + s.decode_tokens));
  EXPECT_GE(s.prefill_tokens, 32);  // the prompts (less what the prefix cache served)
}

}  // namespace
}  // namespace k3::server
