// server/metrics_test.cpp: the /metrics page: vLLM's names and types, cumulative histogram
// buckets with sum and count, counters read from the engine's stats, label escaping.
#include <gtest/gtest.h>

#include <cstring>

#include "server/metrics.h"

namespace k3::server {
namespace {

bool has_line(const std::string& page, const std::string& line) {
  return page.find("\n" + line + "\n") != std::string::npos || page.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  for (double v : {0.05, 0.1, 0.5, 2.0, 3.0}) h.observe(v);
  std::string out;
  h.render("x", "a=\"b\"", out);
  EXPECT_EQ(out,
            "x_bucket{a=\"b\",le=\"0.10000000000000001\"} 2.0\n"
            "x_bucket{a=\"b\",le=\"1.0\"} 3.0\n"
            "x_bucket{a=\"b\",le=\"+Inf\"} 5.0\n"
            "x_sum{a=\"b\"} 5.6500000000000004\n"
            "x_count{a=\"b\"} 5.0\n");
  EXPECT_EQ(h.count(), 5u);
}

TEST(Metrics, PageHasVllmNamesTypesAndEngineCounters) {
  Metrics m("k3-tiny");
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
  EXPECT_TRUE(has_line(page, "vllm:kv_cache_usage_perc" + l + " 0.40000000000000002"));
  EXPECT_TRUE(has_line(page, "# TYPE vllm:time_to_first_token_seconds histogram"));
  EXPECT_TRUE(has_line(page, "vllm:time_to_first_token_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:inter_token_latency_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:e2e_request_latency_seconds_count" + l + " 1.0"));
  EXPECT_TRUE(has_line(page, "vllm:request_success_total{engine=\"0\",model_name=\"k3-tiny\",finished_reason=\"length\"} 1.0"));
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
  Metrics m("we\"ird");
  EXPECT_NE(m.render({}).find("model_name=\"we\\\"ird\""), std::string::npos);
}

TEST(Metrics, SpeculativeDecodingCountersUseVllmNames) {
  Metrics m("k3-tiny");
  engine::EngineStats s;
  const std::string off = m.render(s);
  EXPECT_EQ(off.find("spec_decode"), std::string::npos);  // speculation off: no spec families
  s.spec_method = "synthetic";
  s.spec_synthetic = true;
  s.spec_num_drafts = 5;
  s.spec_num_draft_tokens = 15;
  s.spec_num_accepted_tokens = 9;
  s.spec_accepted_per_pos = {5, 3, 1};
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
}

// decode_backend latency_specialized: steps per path and fallbacks by reason.
TEST(Metrics, DecodePathCountersNameThePathAndTheFallbackReason) {
  Metrics m("k3-tiny");
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

}  // namespace
}  // namespace k3::server
