// loadgen/stats.h: the statistics of a benchmark report: percentiles with numpy's default
// definition (linear interpolation between closest ranks, as vLLM's bench uses through
// np.percentile), a distribution summary, and seeded bootstrap confidence intervals.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::loadgen {

// numpy.percentile(values, q) with method="linear": sorted x[0..n-1], rank h = (n-1)*q/100,
// x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]). q in [0, 100]; 0 for no values.
double percentile(std::vector<double> values, double q);
// Same on values already sorted ascending (no copy).
double percentile_sorted(std::span<const double> sorted, double q);
double mean(std::span<const double> values);
// Population standard deviation (numpy's np.std default, ddof = 0).
double stddev(std::span<const double> values);

// mean, std, min, max, p50, p90, p99 (and the count) of one metric.
struct Distribution {
  int64_t count = 0;
  double mean = 0, std = 0, min = 0, max = 0, p50 = 0, p90 = 0, p99 = 0;
  nlohmann::json to_json() const;
  static Distribution from_json(const nlohmann::json& j);
};
Distribution summarize(std::span<const double> values);

// A two-sided percentile-bootstrap confidence interval of ratio = stat(b) / stat(a): both
// samples are resampled with replacement `resamples` times from a generator seeded with `seed`.
struct RatioInterval {
  double ratio = 0;  // stat(b) / stat(a) on the full samples
  double low = 0, high = 0;
  double level = 0.95;
};
using Statistic = std::function<double(std::span<const double>)>;
RatioInterval bootstrap_ratio(std::span<const double> a, std::span<const double> b, const Statistic& stat,
                              uint64_t seed, int resamples = 2000, double level = 0.95);

// The same with resampling by cluster: each resample draws whole clusters (a request's ITL gaps)
// with replacement and pools their values, so values that move together within a request are not
// counted as independent evidence (an iid bootstrap over correlated gaps gives too narrow a CI).
RatioInterval bootstrap_ratio_clustered(const std::vector<std::vector<double>>& a,
                                        const std::vector<std::vector<double>>& b, const Statistic& stat, uint64_t seed,
                                        int resamples = 2000, double level = 0.95);

}  // namespace k3::loadgen
