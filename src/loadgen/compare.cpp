// loadgen/compare.cpp: the bench-compare report (see compare.h).
#include "loadgen/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/rng.h"
#include "loadgen/bundle.h"
#include "loadgen/request_metrics.h"
#include "loadgen/stats.h"
#include "loadgen/svg.h"

namespace k3::loadgen {

using Json = nlohmann::json;

namespace {

// The per-request (per-gap for ITL) values of one bundle, in ms or tokens/s.
struct Series {
  std::vector<double> ttft, tpot, itl, e2e, interactivity;
  std::vector<std::vector<double>> itl_by_request;  // the bootstrap resamples ITL by request
  const std::vector<double>& get(const std::string& m) const {
    if (m == "ttft_ms") return ttft;
    if (m == "tpot_ms") return tpot;
    if (m == "itl_ms") return itl;
    if (m == "e2e_ms") return e2e;
    return interactivity;
  }
};

Series series_of(const Json& bundle) {
  Series s;
  for (const RequestSample& r : bundle_samples(bundle)) {
    if (!r.ok) continue;
    s.ttft.push_back(r.ttft_s * 1000);
    s.e2e.push_back(r.e2e_s * 1000);
    if (const auto t = request_tpot(r)) {
      s.tpot.push_back(*t * 1000);
      if (*t > 0) s.interactivity.push_back(1.0 / *t);
    }
    for (double g : r.itl_s) s.itl.push_back(g * 1000);
    std::vector<double> gaps;
    for (double g : r.itl_s) gaps.push_back(g * 1000);
    s.itl_by_request.push_back(std::move(gaps));
  }
  return s;
}

// numpy-linear percentile by selection (O(n)): the bootstrap calls it thousands of times.
double select_percentile(std::span<const double> v, double q) {
  if (v.empty()) return 0;
  std::vector<double> c(v.begin(), v.end());
  const double h = static_cast<double>(c.size() - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(lo), c.end());
  const double a = c[lo];
  if (lo + 1 >= c.size()) return a;
  const double b = *std::min_element(c.begin() + static_cast<std::ptrdiff_t>(lo) + 1, c.end());
  return a + (h - static_cast<double>(lo)) * (b - a);
}

struct StatDef {
  std::string name;  // "mean", "p50", ...
  Statistic fn;
};

const std::vector<StatDef>& stat_defs() {
  static const std::vector<StatDef> defs = {
      {"mean", [](std::span<const double> v) { return mean(v); }},
      {"p50", [](std::span<const double> v) { return select_percentile(v, 50); }},
      {"p90", [](std::span<const double> v) { return select_percentile(v, 90); }},
      {"p99", [](std::span<const double> v) { return select_percentile(v, 99); }},
  };
  return defs;
}

// Per-request metrics compared with CIs: name, higher is better.
const std::vector<std::pair<std::string, bool>> kSampleMetrics = {
    {"ttft_ms", false}, {"tpot_ms", false}, {"itl_ms", false}, {"e2e_ms", false}, {"interactivity_tok_s", true}};
// Run-level throughputs (one number per run: ratio only).
const std::vector<std::string> kThroughputs = {"output_throughput", "total_token_throughput", "request_throughput",
                                               "decode_throughput", "prefill_throughput",     "request_goodput"};

std::string fmt(double v) {
  char buf[32];
  if (v == 0) return "0";
  if (std::fabs(v) >= 1000) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else if (std::fabs(v) >= 10) std::snprintf(buf, sizeof(buf), "%.1f", v);
  else std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// A load level: concurrency 16 (not "16.0"), request rate 2.5.
std::string fmt_level(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e9) return std::to_string(static_cast<int64_t>(v));
  return fmt(v);
}

std::string fmt_ratio(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

std::string opt(const Json& j) { return j.is_number() ? fmt(j.get<double>()) : "n/a"; }

// server_metrics.rates.<key> of a bundle, null when absent.
Json server_rate(const Json& b, const char* key) {
  const Json* m = b.contains("server_metrics") ? &b["server_metrics"] : nullptr;
  if (!m || !m->contains("rates") || !(*m)["rates"].contains(key)) return nullptr;
  return (*m)["rates"][key];
}

double summary_number(const Json& bundle, const std::string& key) {
  const Json& s = bundle.at("summary");
  return s.contains(key) && s[key].is_number() ? s[key].get<double>() : 0.0;
}

// The series a bundle belongs to in the sweep plots: its "series" field, else sha + workload.
std::string group_of(const Json& b) {
  if (b.contains("series") && b["series"].is_string() && !b["series"].get<std::string>().empty())
    return b["series"].get<std::string>();
  const Json& env = b.at("environment");
  std::string sha = env.value("git_sha", std::string("unknown")).substr(0, 8);
  if (env.value("git_dirty", false)) sha += "+dirty";
  return sha + " " + b.at("workload").value("kind", std::string("?"));
}

double load_level(const Json& b) {
  const Json& r = b.at("run");
  if (r.value("mode", std::string("concurrency")) == "rate" && r.contains("request_rate") &&
      r["request_rate"].is_number())
    return r["request_rate"].get<double>();
  return r.value("concurrency", 1.0);
}

// The empirical CDF as a staircase: at each value the fraction rises from i/n to (i+1)/n; past
// 400 values every k-th one is drawn (the plot has fewer pixels than that).
std::vector<std::pair<double, double>> cdf_points(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> pts;
  const size_t n = v.size(), step = std::max<size_t>(1, n / 400);
  const double dn = static_cast<double>(n);
  for (size_t i = 0; i < n; i += step) {
    pts.emplace_back(v[i], static_cast<double>(i) / dn);
    pts.emplace_back(v[i], static_cast<double>(std::min(i + step, n)) / dn);
  }
  return pts;
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream f(p);
  K3_CHECK(f.good(), "cannot write '" + p.string() + "'");
  f << text;
}

}  // namespace

CompareResult compare_bundles(const std::vector<LoadedBundle>& bundles, const CompareOptions& o,
                              const std::filesystem::path& out_dir) {
  K3_CHECK(!bundles.empty(), "bench-compare: give at least one bundle");
  K3_CHECK(o.tolerance >= 0 && o.tolerance < 1, "bench-compare: --tolerance must be in [0, 1)");
  CompareResult result;
  std::vector<Series> series;
  for (const LoadedBundle& b : bundles) series.push_back(series_of(b.bundle));

  // ---- comparisons against the baseline
  const Series& base = series[0];
  for (size_t i = 1; i < bundles.size(); ++i) {
    for (size_t m = 0; m < kSampleMetrics.size(); ++m) {
      const auto& [metric, higher_better] = kSampleMetrics[m];
      const std::vector<double>& a = base.get(metric);
      const std::vector<double>& b = series[i].get(metric);
      for (size_t k = 0; k < stat_defs().size(); ++k) {
        const StatDef& st = stat_defs()[k];
        MetricComparison c;
        c.bundle = bundles[i].name;
        c.metric = metric + "." + st.name;
        c.higher_is_better = higher_better;
        if (a.empty() || b.empty()) continue;
        c.baseline = st.fn(a);
        c.value = st.fn(b);
        const uint64_t seed = o.seed ^ core::Rng::hash(c.metric.c_str()) ^ (static_cast<uint64_t>(i) << 48);
        const RatioInterval ci = metric == "itl_ms"
                                     ? bootstrap_ratio_clustered(base.itl_by_request, series[i].itl_by_request, st.fn,
                                                                 seed, o.resamples, o.level)
                                     : bootstrap_ratio(a, b, st.fn, seed, o.resamples, o.level);
        c.ratio = ci.ratio;
        c.has_ci = true;
        c.ci_low = ci.low;
        c.ci_high = ci.high;
        const bool up = ci.low > 1 + o.tolerance, down = ci.high < 1 - o.tolerance;
        if (!up && !down) c.verdict = "no change";
        else c.verdict = (up == higher_better) ? "improvement" : "regression";
        if (c.verdict == "regression") ++result.regressions;
        result.rows.push_back(c);
      }
    }
    for (const std::string& t : kThroughputs) {
      MetricComparison c;
      c.bundle = bundles[i].name;
      c.metric = t;
      c.higher_is_better = true;
      c.baseline = summary_number(bundles[0].bundle, t);
      c.value = summary_number(bundles[i].bundle, t);
      c.ratio = c.baseline != 0 ? c.value / c.baseline : 0;
      result.rows.push_back(c);
    }
  }

  // ---- markdown
  std::string md = "# bench-serve comparison\n\nBaseline: **" + bundles[0].name +
                   "**. Ratios are B / baseline; CIs are " + fmt(o.level * 100) + "% percentile-bootstrap intervals (" +
                   std::to_string(o.resamples) + " resamples, seed " + std::to_string(o.seed) +
                   "); a regression is a CI wholly on the worse side of 1";
  if (o.tolerance > 0) md += " +- " + fmt(o.tolerance);
  md += ". Percentiles: linear interpolation (numpy). Throughputs are one number per run: ratio only.\n\n";
  md +=
      "## Runs\n\n| run | git | GPU | workload | load | requests ok/failed | duration s |\n|---|---|---|---|---|---|---|\n";
  for (const LoadedBundle& b : bundles) {
    const Json& env = b.bundle.at("environment");
    const Json& gpu = env.contains("gpu") ? env["gpu"] : Json("none");
    const std::string gpu_name = gpu.is_array() && !gpu.empty()
                                     ? gpu[0].value("name", std::string("?")) +
                                           (gpu.size() > 1 ? " x" + std::to_string(gpu.size()) : "")
                                     : "none";
    const Json& run = b.bundle.at("run");
    md += "| " + b.name + " | " + env.value("git_sha", std::string("?")).substr(0, 10) +
          (env.value("git_dirty", false) ? "+dirty" : "") + " | " + gpu_name + " | " +
          b.bundle.at("workload").value("kind", std::string("?")) + " | " + run.value("mode", std::string("?")) + " " +
          fmt_level(load_level(b.bundle)) + " | " +
          std::to_string(static_cast<int64_t>(summary_number(b.bundle, "completed"))) + "/" +
          std::to_string(static_cast<int64_t>(summary_number(b.bundle, "failed"))) + " | " +
          fmt(summary_number(b.bundle, "duration_s")) + " |\n";
  }
  md += "\n## Summaries\n\n| metric |";
  for (const LoadedBundle& b : bundles) md += " " + b.name + " |";
  md += "\n|---|";
  for (size_t i = 0; i < bundles.size(); ++i) md += "---|";
  md += "\n";
  auto summary_row = [&](const std::string& label, const std::function<std::string(const Json&)>& cell) {
    md.append("| ").append(label).append(" |");  // (append, not "| " + label: GCC 12 -Wrestrict false alarm)
    for (const LoadedBundle& b : bundles) md.append(" ").append(cell(b.bundle)).append(" |");
    md += "\n";
  };
  for (const std::string& t : kThroughputs) summary_row(t, [&](const Json& b) { return fmt(summary_number(b, t)); });
  for (const char* m : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "interactivity_tpot_tok_s"})
    for (const char* st : {"mean", "p50", "p90", "p99"})
      summary_row(std::string(m) + "." + st, [&](const Json& b) {
        const Json& s = b.at("summary");
        return s.contains(m) && s[m].contains(st) ? fmt(s[m][st].get<double>()) : std::string("n/a");
      });
  summary_row("prefix cache hit rate (server)",
              [](const Json& b) { return opt(server_rate(b, "prefix_cache_hit_rate")); });
  summary_row("prefix cache hit rate (client usage)",
              [](const Json& b) { return fmt(summary_number(b, "client_prefix_hit_rate")); });
  summary_row("spec decode acceptance rate",
              [](const Json& b) { return opt(server_rate(b, "spec_decode_acceptance_rate")); });
  if (bundles.size() > 1) {
    md +=
        "\n## Against the baseline\n\n| run | metric | baseline | value | ratio | CI | verdict |\n|---|---|---|---|---|---|---|\n";
    for (const MetricComparison& c : result.rows) {
      const std::string ci = c.has_ci ? "[" + fmt_ratio(c.ci_low) + ", " + fmt_ratio(c.ci_high) + "]" : "n/a";
      const std::string verdict = c.verdict == "regression" ? "**REGRESSION**" : c.verdict;
      md += "| " + c.bundle + " | " + c.metric + " | " + fmt(c.baseline) + " | " + fmt(c.value) + " | " +
            fmt_ratio(c.ratio) + " | " + ci + " | " + verdict + " |\n";
    }
    md += "\n" + std::to_string(result.regressions) + " regression(s) flagged.\n";
  }

  // ---- plots
  std::vector<std::pair<std::string, SvgPlot>> plots;
  for (const auto& [metric, label] : std::vector<std::pair<std::string, std::string>>{{"ttft_ms", "TTFT (ms)"},
                                                                                      {"tpot_ms", "TPOT (ms)"},
                                                                                      {"itl_ms", "ITL (ms)"},
                                                                                      {"e2e_ms", "E2E latency (ms)"}}) {
    SvgPlot p;
    p.title = label + " CDF";
    p.x_label = label;
    p.y_label = "fraction of requests";
    for (size_t i = 0; i < bundles.size(); ++i)
      p.series.push_back({bundles[i].name, cdf_points(series[i].get(metric)), false});
    plots.emplace_back("cdf_" + metric + ".svg", p);
  }
  std::map<std::string, std::vector<const LoadedBundle*>> groups;
  for (const LoadedBundle& b : bundles) groups[group_of(b.bundle)].push_back(&b);
  SvgPlot tvc, ivt;
  tvc.title = "Output throughput vs load";
  tvc.x_label = "concurrency (or request rate, req/s)";
  tvc.y_label = "output tokens/s";
  ivt.title = "Interactivity vs throughput";
  ivt.x_label = "output tokens/s (all users)";
  ivt.y_label = "median tokens/s per user (1000 / TPOT ms)";
  for (const auto& [group, members] : groups) {
    SvgSeries a{group, {}, true}, b{group, {}, true};
    for (const LoadedBundle* m : members) {
      const double thr = summary_number(m->bundle, "output_throughput");
      const Json& s = m->bundle.at("summary");
      const double inter = s.contains("interactivity_tpot_tok_s") ? s["interactivity_tpot_tok_s"].value("p50", 0.0)
                                                                  : 0.0;
      a.points.emplace_back(load_level(m->bundle), thr);
      b.points.emplace_back(thr, inter);
    }
    std::sort(a.points.begin(), a.points.end());
    std::sort(b.points.begin(), b.points.end());
    tvc.series.push_back(a);
    ivt.series.push_back(b);
  }
  plots.emplace_back("throughput_vs_concurrency.svg", tvc);
  plots.emplace_back("interactivity_vs_throughput.svg", ivt);
  md += "\n## Plots\n\n";
  for (const auto& [file, p] : plots) md += "![" + p.title + "](" + file + ")\n";
  result.markdown = md;

  // ---- json
  Json rows = Json::array();
  for (const MetricComparison& c : result.rows)
    rows.push_back({{"bundle", c.bundle},
                    {"metric", c.metric},
                    {"baseline", c.baseline},
                    {"value", c.value},
                    {"ratio", c.ratio},
                    {"ci", c.has_ci ? Json::array({c.ci_low, c.ci_high}) : Json(nullptr)},
                    {"higher_is_better", c.higher_is_better},
                    {"verdict", c.verdict}});
  Json names = Json::array();
  for (const LoadedBundle& b : bundles) names.push_back({{"name", b.name}, {"path", b.path.string()}});
  result.json = {{"baseline", bundles[0].name},
                 {"bundles", names},
                 {"rows", rows},
                 {"regressions", result.regressions},
                 {"options",
                  {{"seed", o.seed}, {"resamples", o.resamples}, {"level", o.level}, {"tolerance", o.tolerance}}}};

  if (!out_dir.empty()) {
    std::filesystem::create_directories(out_dir);
    write_text(out_dir / "report.md", md);
    write_text(out_dir / "report.json", result.json.dump(1) + "\n");
    for (const auto& [file, p] : plots) {
      write_text(out_dir / file, p.render());
      result.plots.push_back(out_dir / file);
    }
  }
  return result;
}

}  // namespace k3::loadgen
