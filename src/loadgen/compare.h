// loadgen/compare.h: `k3serve bench-compare`: side-by-side report of result bundles against the
// first one (the baseline): per-request latency metrics (TTFT, TPOT, ITL, E2E: mean, p50, p90,
// p99; interactivity) as ratios B / A with seeded percentile-bootstrap confidence intervals, run
// throughputs as plain ratios, and a regression flag when a CI lies wholly on the worse side of
// "no change" (beyond the tolerance band 1 +- tolerance); ITL is resampled by request (a
// request's gaps move together). Writes report.md, report.json and SVG
// plots: latency CDFs, throughput vs concurrency, interactivity vs throughput.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::loadgen {

struct CompareOptions {
  uint64_t seed = 0;  // bootstrap seed (the same inputs give the same report)
  int resamples = 1000;
  double level = 0.95;      // CI level
  double tolerance = 0.05;  // a CI must clear [1 - tol, 1 + tol] to count as a change (run-to-run noise)
};

struct LoadedBundle {
  std::string name;  // label or file stem
  std::filesystem::path path;
  nlohmann::json bundle;
};

// One compared quantity of one bundle against the baseline.
struct MetricComparison {
  std::string bundle;  // the compared bundle's name
  std::string metric;  // e.g. "ttft_ms.p99"
  double baseline = 0, value = 0, ratio = 0;
  bool has_ci = false;
  double ci_low = 0, ci_high = 0;
  bool higher_is_better = false;
  std::string verdict;  // "regression", "improvement", "no change" or "" (no CI)
};

struct CompareResult {
  std::vector<MetricComparison> rows;
  int regressions = 0;
  std::string markdown;
  nlohmann::json json;
  std::vector<std::filesystem::path> plots;  // written files
};

// Compares bundles[1..] against bundles[0]; writes report.md, report.json and the plots into
// out_dir (created) when it is not empty.
CompareResult compare_bundles(const std::vector<LoadedBundle>& bundles, const CompareOptions& options,
                              const std::filesystem::path& out_dir);

}  // namespace k3::loadgen
