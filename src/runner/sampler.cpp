// runner/sampler.cpp: Sampler.
#include "runner/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace k3::runner {

void validate(const SamplingParams& p) {
  K3_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
           "temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  K3_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "top_p must be in (0, 1], got " + std::to_string(p.top_p));
  K3_CHECK(p.top_k >= 0, "top_k must be >= 0 (0 disables it), got " + std::to_string(p.top_k));
  K3_CHECK(p.min_p >= 0.0f && p.min_p <= 1.0f, "min_p must be in [0, 1], got " + std::to_string(p.min_p));
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { validate(params_); }

int32_t Sampler::sample(std::span<const float> logits) {
  K3_CHECK(!logits.empty(), "sample: empty logits");
  for (float v : logits) K3_CHECK(!std::isnan(v), "sample: logits contain NaN");
  const auto n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Candidates by descending logit (ties: lower id first), so filters cut a prefix.
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));

  const double inv_t = 1.0 / params_.temperature, top = logits[order[0]];
  std::vector<double> prob(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += prob[i] = std::exp((logits[order[i]] - top) * inv_t);
  // min-p: drop tokens below min_p times the most likely one.
  while (keep > 1 && prob[keep - 1] < params_.min_p * prob[0]) total -= prob[--keep];
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      mass += prob[i];
      if (mass >= params_.top_p * total) {
        keep = i + 1;
        break;
      }
    }
  }
  total = std::accumulate(prob.begin(), prob.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  double r = rng_.uniform() * total;
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace k3::runner
