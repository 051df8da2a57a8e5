// loadgen/metrics_test.cpp: percentiles (numpy linear), the vLLM-bench metric definitions on a
// hand-built timeline with known answers, goodput SLOs, phase throughputs, the bootstrap, and
// the parsers of the wire formats (SSE events, Prometheus text).
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/rng.h"
#include "loadgen/client.h"
#include "loadgen/request_metrics.h"
#include "loadgen/stats.h"

namespace k3::loadgen {
namespace {

TEST(Stats, PercentileIsNumpyLinear) {
  // np.percentile([1, 2, 3, 4], [0, 25, 50, 90, 99, 100]) = 1, 1.75, 2.5, 3.7, 3.97, 4
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.75);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
  EXPECT_NEAR(percentile(v, 90), 3.7, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  EXPECT_THROW(percentile(v, 101), core::Error);
}

TEST(Stats, SummarizeMeanStdMinMax) {
  const std::vector<double> v = {2, 4, 4, 4, 5, 5, 7, 9};
  const Distribution d = summarize(v);
  EXPECT_EQ(d.count, 8);
  EXPECT_DOUBLE_EQ(d.mean, 5);
  EXPECT_DOUBLE_EQ(d.std, 2);  // population std
  EXPECT_DOUBLE_EQ(d.min, 2);
  EXPECT_DOUBLE_EQ(d.max, 9);
  EXPECT_DOUBLE_EQ(d.p50, 4.5);
  EXPECT_EQ(Distribution::from_json(d.to_json()).to_json(), d.to_json());
}

// The timeline (seconds since the run started):
//   A: sent 0.00, token chunks at +0.10 +0.15 +0.25 +0.30, ends +0.31; 4 tokens, 10 in, 5 cached
//   B: sent 0.05, chunks at +0.20 +0.30, ends +0.30; 2 tokens, 20 in, cached not reported
//   C: sent 0.50, one chunk at +0.05, ends +0.05; 1 token, 30 in, 10 cached
//   D: failed
std::vector<RequestSample> timeline() {
  RequestSample a, b, c, d;
  a.input_tokens = 10, a.output_tokens = 4, a.cached_tokens = 5, a.start_s = 0, a.ttft_s = 0.10, a.e2e_s = 0.31;
  a.itl_s = {0.05, 0.10, 0.05}, a.ok = true;
  b.input_tokens = 20, b.output_tokens = 2, b.start_s = 0.05, b.ttft_s = 0.20, b.e2e_s = 0.30, b.itl_s = {0.10};
  b.ok = true;
  c.input_tokens = 30, c.output_tokens = 1, c.cached_tokens = 10, c.start_s = 0.5, c.ttft_s = 0.05, c.e2e_s = 0.05;
  c.ok = true;
  d.input_tokens = 99, d.start_s = 0.6, d.e2e_s = 0.01, d.error = "HTTP 500";
  return {a, b, c, d};
}

TEST(RequestMetrics, HandBuiltTimelineHasKnownAnswers) {
  const ServingSummary s = summarize_run(timeline(), 1.0, parse_slos({"ttft:150", "tpot:80"}));
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 60);
  EXPECT_EQ(s.total_output_tokens, 7);
  EXPECT_DOUBLE_EQ(s.request_throughput, 3);
  EXPECT_DOUBLE_EQ(s.output_throughput, 7);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 67);
  // TTFT ms [100, 200, 50]
  EXPECT_NEAR(s.ttft_ms.mean, 350.0 / 3, 1e-9);
  EXPECT_NEAR(s.ttft_ms.p50, 100, 1e-9);
  EXPECT_NEAR(s.ttft_ms.p90, 180, 1e-9);
  EXPECT_NEAR(s.ttft_ms.p99, 198, 1e-9);
  // TPOT = (E2E - TTFT) / (out - 1): A 70 ms, B 100 ms; C (1 token) has none
  EXPECT_EQ(s.tpot_ms.count, 2);
  EXPECT_NEAR(s.tpot_ms.mean, 85, 1e-9);
  EXPECT_NEAR(s.tpot_ms.p90, 97, 1e-9);
  EXPECT_NEAR(s.tpot_ms.p99, 99.7, 1e-9);
  // ITL ms: every gap of every request [50, 100, 50, 100]
  EXPECT_EQ(s.itl_ms.count, 4);
  EXPECT_NEAR(s.itl_ms.mean, 75, 1e-9);
  EXPECT_NEAR(s.itl_ms.p50, 75, 1e-9);
  EXPECT_NEAR(s.itl_ms.p90, 100, 1e-9);
  EXPECT_NEAR(s.e2e_ms.p50, 300, 1e-9);
  EXPECT_NEAR(s.e2e_ms.max, 310, 1e-9);
  // Interactivity 1000 / TPOT(ms): 14.2857 and 10 tokens/s per user
  EXPECT_NEAR(s.interactivity_tpot.p50, (1000.0 / 70 + 10) / 2, 1e-9);
  EXPECT_NEAR(s.interactivity_itl.max, 20, 1e-9);
  // Goodput: A meets ttft 150 and tpot 80; B misses ttft; C meets both (TPOT of a 1-token reply is 0).
  EXPECT_EQ(s.good_requests, 2);
  EXPECT_DOUBLE_EQ(s.request_goodput, 2);
  // Prefill busy: [0, .1] u [.05, .25] u [.5, .55] = 0.30 s for 60 prompt tokens.
  EXPECT_NEAR(s.prefill_busy_s, 0.30, 1e-12);
  EXPECT_NEAR(s.prefill_throughput, 200, 1e-9);
  // Decode busy: [.1, .31] u [.25, .35] = 0.25 s for (4-1) + (2-1) tokens.
  EXPECT_NEAR(s.decode_busy_s, 0.25, 1e-12);
  EXPECT_NEAR(s.decode_throughput, 16, 1e-9);
  // Cached tokens over the input of the requests that report them: 15 / 40.
  EXPECT_NEAR(s.client_prefix_hit_rate, 0.375, 1e-12);
}

TEST(RequestMetrics, GoodputWithE2eSloAndNoSlo) {
  const auto samples = timeline();
  EXPECT_EQ(summarize_run(samples, 2.0, parse_slos({"e2e:305"})).good_requests, 2);  // A (310) misses
  const ServingSummary none = summarize_run(samples, 2.0, {});
  EXPECT_EQ(none.good_requests, 3);  // no SLO: every completed request is good
  EXPECT_DOUBLE_EQ(none.request_goodput, 1.5);
}

TEST(RequestMetrics, SloParsingNamesTheBadItem) {
  const Slos s = parse_slos({"ttft:500", "tpot:50", "e2e:3000"});
  EXPECT_EQ(*s.ttft_ms, 500);
  EXPECT_EQ(*s.tpot_ms, 50);
  EXPECT_EQ(*s.e2e_ms, 3000);
  EXPECT_EQ(Slos::from_json(s.to_json()).to_json(), s.to_json());
  auto message = [](const std::string& item) {
    try {
      parse_slos({item});
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("ttft").find("'ttft' is not KEY:MILLISECONDS"), std::string::npos);
  EXPECT_NE(message("tpot:-3").find("positive number"), std::string::npos);
  EXPECT_NE(message("tpot:5x").find("positive number"), std::string::npos);
  EXPECT_NE(message("latency:5").find("unknown SLO 'latency'"), std::string::npos);
}

TEST(RequestMetrics, UnionLength) {
  EXPECT_DOUBLE_EQ(union_length({}), 0);
  EXPECT_DOUBLE_EQ(union_length({{0, 1}, {2, 3}}), 2);
  EXPECT_DOUBLE_EQ(union_length({{0, 2}, {1, 3}, {1.5, 1.7}}), 3);
  EXPECT_DOUBLE_EQ(union_length({{5, 5}, {1, 2}}), 1);  // empty intervals add nothing
}

TEST(RequestMetrics, SampleJsonRoundTrip) {
  for (const RequestSample& s : timeline()) EXPECT_EQ(RequestSample::from_json(s.to_json()).to_json(), s.to_json());
}

std::vector<double> lognormal(uint64_t seed, size_t n, double median, double scale = 1.0) {
  core::Rng rng(seed);
  std::vector<double> v(n);
  for (double& x : v) x = scale * median * std::exp(rng.normal(0, 0.3));
  return v;
}

TEST(Stats, BootstrapSeesAPlantedShiftAndNotNoise) {
  const Statistic m = [](std::span<const double> v) { return mean(v); };
  const auto a = lognormal(1, 300, 100), same = lognormal(2, 300, 100), slower = lognormal(3, 300, 100, 1.2);
  const RatioInterval no_change = bootstrap_ratio(a, same, m, 7);
  EXPECT_LT(no_change.low, 1.0);
  EXPECT_GT(no_change.high, 1.0);
  const RatioInterval shift = bootstrap_ratio(a, slower, m, 7);
  EXPECT_GT(shift.low, 1.05);
  EXPECT_LT(shift.low, shift.ratio);
  EXPECT_GT(shift.high, shift.ratio);
  // Seeded: the same call gives the same interval.
  const RatioInterval again = bootstrap_ratio(a, slower, m, 7);
  EXPECT_EQ(again.low, shift.low);
  EXPECT_EQ(again.high, shift.high);
  EXPECT_THROW(bootstrap_ratio({}, a, m, 1), core::Error);
}

TEST(Stats, ClusteredBootstrapWidensForCorrelatedGaps) {
  // 100 requests of 50 gaps each; a request's gaps all share its own lognormal level, so there
  // are 100 independent values, not 5000.
  auto requests = [](uint64_t seed) {
    core::Rng rng(seed);
    std::vector<std::vector<double>> out(100);
    for (auto& r : out) r.assign(50, 20 * std::exp(rng.normal(0, 0.3)));
    return out;
  };
  const auto a = requests(1), b = requests(2);
  std::vector<double> fa, fb;
  for (const auto& r : a) fa.insert(fa.end(), r.begin(), r.end());
  for (const auto& r : b) fb.insert(fb.end(), r.begin(), r.end());
  const Statistic m = [](std::span<const double> v) { return mean(v); };
  const RatioInterval iid = bootstrap_ratio(fa, fb, m, 3, 500);
  const RatioInterval clustered = bootstrap_ratio_clustered(a, b, m, 3, 500);
  EXPECT_DOUBLE_EQ(clustered.ratio, iid.ratio);
  EXPECT_GT(clustered.high - clustered.low, 4 * (iid.high - iid.low));  // about sqrt(50) x wider
  EXPECT_LT(clustered.low, 1.0);
  EXPECT_GT(clustered.high, 1.0);
  // Requests without gaps (1-token replies) are allowed.
  auto with_empty = a;
  with_empty.push_back({});
  EXPECT_NO_THROW(bootstrap_ratio_clustered(with_empty, b, m, 3, 100));
  EXPECT_THROW(bootstrap_ratio_clustered({{}}, b, m, 3, 100), core::Error);
}

TEST(Wire, SseEventsSplitAcrossReads) {
  SseParser p;
  std::vector<std::string> got;
  const std::string body = "data: {\"a\":1}\n\ndata: {\"b\":2}\r\n\r\n: comment\n\ndata: [DONE]\n\n";
  for (size_t i = 0; i < body.size(); i += 5) {  // 5-byte reads cut events anywhere
    const auto ev = p.feed(body.data() + i, std::min<size_t>(5, body.size() - i));
    got.insert(got.end(), ev.begin(), ev.end());
  }
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
}

TEST(Wire, PrometheusSumsLabelSetsAndSkipsBuckets) {
  const std::string before =
      "# HELP vllm:prefix_cache_queries_total x\n# TYPE vllm:prefix_cache_queries_total counter\n"
      "vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n"
      "vllm:prefix_cache_hits_total{model_name=\"m\"} 10\n"
      "vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"} 3\n"
      "vllm:request_success_total{model_name=\"m\",finished_reason=\"length\"} 4\n"
      "vllm:e2e_request_latency_seconds_bucket{le=\"0.1\"} 2\n"
      "vllm:e2e_request_latency_seconds_count 7\n";
  const auto a = parse_prometheus(before);
  EXPECT_EQ(a.at("vllm:request_success_total"), 7);
  EXPECT_EQ(a.count("vllm:e2e_request_latency_seconds_bucket"), 0u);
  EXPECT_EQ(a.at("vllm:e2e_request_latency_seconds_count"), 7);
  auto b = a;
  b["vllm:prefix_cache_queries_total"] = 300;
  b["vllm:prefix_cache_hits_total"] = 160;
  const auto d = metric_deltas(a, b);
  EXPECT_EQ(d.at("vllm:prefix_cache_queries_total"), 200);
  const nlohmann::json rates = server_side_rates(d);
  EXPECT_DOUBLE_EQ(rates["prefix_cache_hit_rate"].get<double>(), 0.75);
  EXPECT_TRUE(rates["spec_decode_acceptance_rate"].is_null());  // the server has no such counters
  // With vLLM's spec-decode counters (suffix-less names accepted too).
  b["vllm:spec_decode_num_drafts"] = 10;
  b["vllm:spec_decode_num_draft_tokens_total"] = 40;
  b["vllm:spec_decode_num_accepted_tokens_total"] = 30;
  const nlohmann::json spec = server_side_rates(metric_deltas(a, b));
  EXPECT_DOUBLE_EQ(spec["spec_decode_acceptance_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(spec["spec_decode_mean_acceptance_length"].get<double>(), 4.0);
}

}  // namespace
}  // namespace k3::loadgen
