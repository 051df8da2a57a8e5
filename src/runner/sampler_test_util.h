// runner/sampler_test_util.h: helpers shared by the sampler tests — a naive full-sort
// reference of the filtered distribution, log_softmax, draw histograms and a chi-square check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "runner/sampler.h"

namespace k3::runner::testing {

// log_softmax in double, the oracle for SampleResult logprobs.
inline std::vector<double> log_softmax(std::span<const float> x) {
  const double m = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (float v : x) z += std::exp(v - m);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(z);
  return out;
}

// The distribution steps 5-8 of sampler.h define over already-processed logits, for T > 0,
// computed the obvious way: full stable sort, double precision, filters one after another.
inline std::vector<double> reference_distribution(std::span<const float> x, const SamplingParams& p) {
  const size_t vocab = x.size();
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  const double m = x[order[0]];
  std::vector<double> q(vocab, 0.0);
  for (size_t i = 0; i < vocab; ++i) q[i] = std::exp((x[i] - m) / p.temperature);
  size_t keep = (p.top_k <= 0 || static_cast<size_t>(p.top_k) >= vocab) ? vocab : static_cast<size_t>(p.top_k);
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += q[order[i]];
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < keep; ++i) {
      cum += q[order[i]];
      if (cum >= p.top_p * mass) {
        keep = i + 1;
        break;
      }
    }
  }
  std::vector<double> dist(vocab, 0.0);
  double total = 0;
  for (size_t i = 0; i < keep; ++i)
    if (q[order[i]] >= p.min_p) total += dist[order[i]] = q[order[i]];
  for (double& d : dist) d /= total;
  return dist;
}

inline std::vector<int> histogram(Sampler& s, std::span<const float> logits, int draws,
                                  std::span<const int32_t> prompt = {}, std::span<const int32_t> output = {}) {
  std::vector<int> count(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++count[static_cast<size_t>(s.sample(logits, prompt, output).token)];
  return count;
}

// Ids drawn at least once.
inline std::vector<int32_t> support(const std::vector<int>& count) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < count.size(); ++i)
    if (count[i] > 0) ids.push_back(static_cast<int32_t>(i));
  return ids;
}

// Pearson chi-square of counts against probs (cells with p > 0); fails if a p = 0 cell was
// drawn or the statistic exceeds the 99.9% quantile (Wilson-Hilferty approximation). Every
// cell used here expects hundreds of draws, so the chi-square approximation holds.
inline void expect_chi_square_fits(const std::vector<int>& count, const std::vector<double>& probs,
                                   const std::string& what) {
  ASSERT_EQ(count.size(), probs.size());
  const double n = std::accumulate(count.begin(), count.end(), 0.0);
  double chi2 = 0;
  int cells = 0;
  for (size_t i = 0; i < count.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(count[i], 0) << what << ": id " << i << " is outside the support but was drawn";
      continue;
    }
    const double expected = n * probs[i];
    EXPECT_GE(expected, 20.0) << what << ": test design: cell " << i << " too small for chi-square";
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
    ++cells;
  }
  const double df = std::max(cells - 1, 1);
  const double z999 = 3.090232;
  const double a = 2.0 / (9.0 * df);
  const double critical = df * std::pow(1.0 - a + z999 * std::sqrt(a), 3.0);
  EXPECT_LT(chi2, critical) << what << ": chi-square " << chi2 << " with " << df << " degrees of freedom";
}

// The message of the core::Error f throws; empty when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const core::Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace k3::runner::testing
