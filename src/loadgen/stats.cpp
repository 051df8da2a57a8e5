// loadgen/stats.cpp: percentiles, summaries and the bootstrap (see stats.h for definitions).
#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace k3::loadgen {

double percentile_sorted(std::span<const double> x, double q) {
  if (x.empty()) return 0;
  K3_CHECK(q >= 0 && q <= 100, "percentile: q must be in [0, 100], got " + std::to_string(q));
  const double h = static_cast<double>(x.size() - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= x.size()) return x.back();
  return x[lo] + (h - static_cast<double>(lo)) * (x[lo + 1] - x[lo]);
}

double percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return percentile_sorted(values, q);
}

double mean(std::span<const double> v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(std::span<const double> v) {
  if (v.empty()) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

Distribution summarize(std::span<const double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::vector<double> s(values.begin(), values.end());
  std::sort(s.begin(), s.end());
  d.count = static_cast<int64_t>(s.size());
  d.mean = mean(s);
  d.std = stddev(s);
  d.min = s.front();
  d.max = s.back();
  d.p50 = percentile_sorted(s, 50);
  d.p90 = percentile_sorted(s, 90);
  d.p99 = percentile_sorted(s, 99);
  return d;
}

nlohmann::json Distribution::to_json() const {
  return {{"count", count}, {"mean", mean}, {"std", std}, {"min", min},
          {"max", max},     {"p50", p50},   {"p90", p90}, {"p99", p99}};
}

Distribution Distribution::from_json(const nlohmann::json& j) {
  Distribution d;
  d.count = j.at("count").get<int64_t>();
  d.mean = j.at("mean").get<double>();
  d.std = j.at("std").get<double>();
  d.min = j.at("min").get<double>();
  d.max = j.at("max").get<double>();
  d.p50 = j.at("p50").get<double>();
  d.p90 = j.at("p90").get<double>();
  d.p99 = j.at("p99").get<double>();
  return d;
}

RatioInterval bootstrap_ratio(std::span<const double> a, std::span<const double> b, const Statistic& stat,
                              uint64_t seed, int resamples, double level) {
  K3_CHECK(!a.empty() && !b.empty(), "bootstrap: both samples need at least one value");
  K3_CHECK(resamples >= 10, "bootstrap: at least 10 resamples, got " + std::to_string(resamples));
  K3_CHECK(level > 0 && level < 1, "bootstrap: level must be in (0, 1)");
  RatioInterval r;
  r.level = level;
  const double sa = stat(a), sb = stat(b);
  r.ratio = sa != 0 ? sb / sa : 0;
  core::Rng rng(seed);
  std::vector<double> ratios, ra(a.size()), rb(b.size());
  ratios.reserve(static_cast<size_t>(resamples));
  auto draw = [&](std::span<const double> from, std::vector<double>& to) {
    for (double& x : to) x = from[static_cast<size_t>(rng.next_u64() % from.size())];
  };
  for (int i = 0; i < resamples; ++i) {
    draw(a, ra);
    draw(b, rb);
    const double den = stat(ra);
    if (den != 0) ratios.push_back(stat(rb) / den);
  }
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1 - level) / 2 * 100;
  r.low = percentile_sorted(ratios, tail);
  r.high = percentile_sorted(ratios, 100 - tail);
  return r;
}

RatioInterval bootstrap_ratio_clustered(const std::vector<std::vector<double>>& a,
                                        const std::vector<std::vector<double>>& b, const Statistic& stat, uint64_t seed,
                                        int resamples, double level) {
  auto pooled = [](const std::vector<std::vector<double>>& clusters) {
    std::vector<double> out;
    for (const auto& c : clusters) out.insert(out.end(), c.begin(), c.end());
    return out;
  };
  const std::vector<double> fa = pooled(a), fb = pooled(b);
  K3_CHECK(!fa.empty() && !fb.empty(), "bootstrap: both samples need at least one value");
  K3_CHECK(resamples >= 10, "bootstrap: at least 10 resamples, got " + std::to_string(resamples));
  K3_CHECK(level > 0 && level < 1, "bootstrap: level must be in (0, 1)");
  RatioInterval r;
  r.level = level;
  const double sa = stat(fa), sb = stat(fb);
  r.ratio = sa != 0 ? sb / sa : 0;
  core::Rng rng(seed);
  std::vector<double> ratios, ra, rb;
  ratios.reserve(static_cast<size_t>(resamples));
  auto draw = [&](const std::vector<std::vector<double>>& from, std::vector<double>& to) {
    to.clear();
    for (size_t i = 0; i < from.size(); ++i) {
      const auto& c = from[static_cast<size_t>(rng.next_u64() % from.size())];
      to.insert(to.end(), c.begin(), c.end());
    }
  };
  for (int i = 0; i < resamples; ++i) {
    draw(a, ra);
    draw(b, rb);
    if (ra.empty() || rb.empty()) continue;  // every drawn cluster was empty
    const double den = stat(ra);
    if (den != 0) ratios.push_back(stat(rb) / den);
  }
  K3_CHECK(!ratios.empty(), "bootstrap: no resample had values on both sides");
  std::sort(ratios.begin(), ratios.end());
  const double tail = (1 - level) / 2 * 100;
  r.low = percentile_sorted(ratios, tail);
  r.high = percentile_sorted(ratios, 100 - tail);
  return r;
}

}  // namespace k3::loadgen
