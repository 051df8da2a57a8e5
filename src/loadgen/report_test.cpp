// loadgen/report_test.cpp: result bundles round-trip through files; bench-compare flags a planted
// 20% latency regression and does not flag two samples of one distribution (fixed seeds); the
// SVG plots are written and well-formed (every tag closed, in order).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "evidence/environment.h"
#include "loadgen/bundle.h"
#include "loadgen/compare.h"
#include "loadgen/request_metrics.h"
#include "loadgen/svg.h"
#include "loadgen/workload.h"

namespace k3::loadgen {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("k3-loadgen-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A synthetic run: `n` requests of 11 tokens, lognormal TTFT (median 100 ms) and ITL gaps
// (median 20 ms), all latencies times `slowdown`.
Json synthetic_bundle(uint64_t seed, int n, double slowdown, int64_t concurrency, const std::string& label) {
  core::Rng rng(seed);
  std::vector<RequestSample> samples;
  Json sample_json = Json::array();
  double t = 0;
  for (int i = 0; i < n; ++i) {
    RequestSample s;
    s.session = i;
    s.input_tokens = 100;
    s.expected_output_tokens = s.output_tokens = 11;
    s.cached_tokens = 0;
    s.start_s = t;
    s.ttft_s = slowdown * 0.1 * std::exp(rng.normal(0, 0.3));
    s.e2e_s = s.ttft_s;
    for (int k = 0; k < 10; ++k) {
      s.itl_s.push_back(slowdown * 0.02 * std::exp(rng.normal(0, 0.3)));
      s.e2e_s += s.itl_s.back();
    }
    s.ok = true;
    t += 0.05;
    samples.push_back(s);
    sample_json.push_back(s.to_json());
  }
  const double duration = t + 1;
  WorkloadSpec w;
  w.seed = seed;
  return {{"schema", kBundleSchema},
          {"label", label},
          {"series", "synthetic"},
          {"environment", {{"git_sha", "0123456789abcdef"}, {"git_dirty", false}, {"gpu", "none"}}},
          {"workload", w.to_json()},
          {"run", {{"mode", "concurrency"}, {"concurrency", concurrency}}},
          {"slos", Json::object()},
          {"server_metrics", {{"rates", {{"prefix_cache_hit_rate", 0.5}, {"spec_decode_acceptance_rate", nullptr}}}}},
          {"summary", summarize_run(samples, duration, {}).to_json()},
          {"samples", sample_json}};
}

TEST(Bundle, RoundTripThroughAFile) {
  const fs::path dir = temp_dir("bundle");
  Json b = synthetic_bundle(1, 17, 1.0, 1, "one");
  b["environment"] = evidence::environment();
  write_bundle(b, dir / "sub" / "run.json");
  const Json back = read_bundle(dir / "sub" / "run.json");
  EXPECT_EQ(back, b);
  const auto samples = bundle_samples(back);
  ASSERT_EQ(samples.size(), 17u);
  EXPECT_EQ(samples[3].to_json(), b["samples"][3]);
  EXPECT_EQ(bundle_name(back, dir / "run.json"), "one");
  EXPECT_EQ(bundle_name(Json::object(), dir / "run.json"), "run");
  // The environment names the source revision and the GPU (or "none" without nvidia-smi).
  EXPECT_TRUE(back["environment"].contains("git_sha"));
  EXPECT_TRUE(back["environment"]["git_dirty"].is_boolean());
  EXPECT_TRUE(back["environment"]["gpu"].is_string() || back["environment"]["gpu"].is_array());
  EXPECT_FALSE(back["environment"]["cpu"].get<std::string>().empty());
  fs::remove_all(dir);
}

TEST(Bundle, ReadErrorsNameFileAndField) {
  const fs::path dir = temp_dir("bundle-bad");
  auto message = [&](const std::string& text) {
    std::ofstream(dir / "b.json") << text;
    try {
      read_bundle(dir / "b.json");
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("is not a JSON object"), std::string::npos);
  EXPECT_NE(message("{\"schema\": \"other/1\"}").find("has schema 'other/1'"), std::string::npos);
  Json b = synthetic_bundle(1, 3, 1.0, 1, "x");
  b.erase("summary");
  EXPECT_NE(message(b.dump()).find("lacks the field 'summary'"), std::string::npos);
  b = synthetic_bundle(1, 3, 1.0, 1, "x");
  b["samples"][1].erase("ttft_s");
  EXPECT_NE(message(b.dump()).find("a sample is malformed"), std::string::npos);
  EXPECT_THROW(read_bundle(dir / "missing.json"), core::Error);
  EXPECT_NE(file_hash(dir / "b.json"), text_hash(""));
  EXPECT_EQ(text_hash(""), "cbf29ce484222325");  // FNV-1a 64 offset basis
  fs::remove_all(dir);
}

// Tags open and close in order; attribute values are quoted. A small XML well-formedness check.
bool well_formed(const std::string& svg, std::string& why) {
  std::vector<std::string> stack;
  const std::regex tag(R"(<(/?)([A-Za-z_][\w:-]*)((?:\s+[\w:-]+="[^"<]*")*)\s*(/?)>)");
  size_t pos = svg.find("<svg");
  if (svg.rfind("<?xml", 0) != 0 || pos == std::string::npos) return why = "no XML declaration or svg root", false;
  while (pos < svg.size()) {
    const size_t open = svg.find('<', pos);
    if (open == std::string::npos) break;
    const size_t close = svg.find('>', open);
    if (close == std::string::npos) return why = "unterminated tag", false;
    const std::string t = svg.substr(open, close - open + 1);
    std::smatch m;
    if (!std::regex_match(t, m, tag)) return why = "malformed tag " + t, false;
    if (m[1] == "/") {
      if (stack.empty() || stack.back() != m[2]) return why = "unbalanced " + t, false;
      stack.pop_back();
    } else if (m[4] != "/") {
      stack.push_back(m[2]);
    }
    const std::string text = svg.substr(close + 1, svg.find('<', close) - close - 1);
    if (text.find('&') != std::string::npos && !std::regex_search(text, std::regex("&(amp|lt|gt|quot|apos);")))
      return why = "raw & in text", false;
    pos = close + 1;
  }
  if (!stack.empty()) return why = "unclosed <" + stack.back() + ">", false;
  return true;
}

TEST(Svg, PlotsAreWellFormedAndEscaped) {
  SvgPlot p;
  p.title = "TTFT <ms> & more";
  p.x_label = "x";
  p.y_label = "y";
  p.series.push_back({"a & b", {{0, 0}, {1, 2}, {2, 3}}, true});
  p.series.push_back({"\"quoted\"", {{0.5, 1}, {1.5, std::nan("")}}, false});  // a NaN point is skipped
  const std::string svg = p.render();
  std::string why;
  EXPECT_TRUE(well_formed(svg, why)) << why;
  EXPECT_NE(svg.find("TTFT &lt;ms&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("a &amp; b"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  SvgPlot empty;
  EXPECT_TRUE(well_formed(empty.render(), why)) << why;
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(0, 1, 4), (std::vector<double>{0, 0.5, 1}));
}

std::vector<LoadedBundle> loaded(const std::vector<Json>& bundles) {
  std::vector<LoadedBundle> out;
  for (const Json& b : bundles)
    out.push_back({b["label"].get<std::string>(), b["label"].get<std::string>() + ".json", b});
  return out;
}

TEST(Compare, FlagsAPlantedRegression) {
  const fs::path dir = temp_dir("compare");
  CompareOptions o;
  o.seed = 11;
  o.tolerance = 0.05;
  const CompareResult r = compare_bundles(
      loaded({synthetic_bundle(1, 200, 1.0, 1, "base"), synthetic_bundle(2, 200, 1.2, 1, "slow")}), o, dir);
  EXPECT_GT(r.regressions, 0);
  auto row = [&](const std::string& metric) {
    for (const MetricComparison& c : r.rows)
      if (c.metric == metric) return c;
    ADD_FAILURE() << "no row " << metric;
    return MetricComparison{};
  };
  for (const char* m : {"ttft_ms.mean", "tpot_ms.mean", "itl_ms.mean", "e2e_ms.mean", "itl_ms.p50"}) {
    const MetricComparison c = row(m);
    EXPECT_EQ(c.verdict, "regression") << m;
    EXPECT_NEAR(c.ratio, 1.2, 0.08) << m;
    EXPECT_GT(c.ci_low, 1.05) << m;
  }
  EXPECT_EQ(row("interactivity_tok_s.mean").verdict, "regression");  // lower tokens/s per user
  EXPECT_FALSE(row("output_throughput").has_ci);
  EXPECT_NE(r.markdown.find("**REGRESSION**"), std::string::npos);
  EXPECT_EQ(r.json["regressions"].get<int>(), r.regressions);
  // The report and every plot are on disk, and the report links the plots.
  EXPECT_TRUE(fs::exists(dir / "report.md"));
  EXPECT_TRUE(fs::exists(dir / "report.json"));
  ASSERT_EQ(r.plots.size(), 6u);
  for (const fs::path& p : r.plots) {
    std::stringstream s;
    s << std::ifstream(p).rdbuf();
    std::string why;
    EXPECT_TRUE(well_formed(s.str(), why)) << p << ": " << why;
    EXPECT_NE(r.markdown.find(p.filename().string()), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(Compare, DoesNotFlagTwoRunsOfTheSameBuild) {
  CompareOptions o;
  o.seed = 11;
  o.tolerance = 0.05;
  const CompareResult r = compare_bundles(
      loaded({synthetic_bundle(1, 200, 1.0, 1, "run1"), synthetic_bundle(2, 200, 1.0, 1, "run2")}), o, {});
  EXPECT_EQ(r.regressions, 0) << r.markdown;
  for (const MetricComparison& c : r.rows) {
    if (c.has_ci) {
      EXPECT_NE(c.verdict, "improvement") << c.metric;
    }
  }
  // Same inputs, same seed: the same report.
  const CompareResult again = compare_bundles(
      loaded({synthetic_bundle(1, 200, 1.0, 1, "run1"), synthetic_bundle(2, 200, 1.0, 1, "run2")}), o, {});
  EXPECT_EQ(again.markdown, r.markdown);
}

TEST(Compare, SweepPlotsGroupBySeries) {
  const fs::path dir = temp_dir("sweep");
  std::vector<Json> runs;
  for (int64_t c : {1, 2, 16})
    runs.push_back(synthetic_bundle(static_cast<uint64_t>(c), 17, 1.0, c, "c" + std::to_string(c)));
  const CompareResult r = compare_bundles(loaded(runs), CompareOptions{}, dir);
  // The runs table names each level as given: "concurrency 16", not "16.0".
  EXPECT_NE(r.markdown.find("| concurrency 16 |"), std::string::npos) << r.markdown.substr(0, 800);
  std::stringstream s;
  s << std::ifstream(dir / "throughput_vs_concurrency.svg").rdbuf();
  const std::string svg = s.str();
  EXPECT_NE(svg.find(">synthetic</text>"), std::string::npos);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n') > 10, true);
  size_t circles = 0;
  for (size_t p = 0; (p = svg.find("<circle", p)) != std::string::npos; ++p) ++circles;
  EXPECT_EQ(circles, 3u);  // one point per run, on one curve
  EXPECT_THROW(compare_bundles({}, CompareOptions{}, {}), core::Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace k3::loadgen
