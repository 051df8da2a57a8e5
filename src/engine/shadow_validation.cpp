// engine/shadow_validation.cpp: logits comparison and kernel summaries for shadow validation.
#include "engine/shadow_validation.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"

namespace k3::engine {

ShadowTolerance shadow_tolerance(bool fp32) {
  if (!fp32) return {};
  return {.min_cosine = 1 - 1e-5, .max_abs_rel = 1e-4, .tie_rel = 1e-4};
}

namespace {
int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;  // the lowest id on ties, as greedy sampling picks
  return best;
}
}  // namespace

ShadowReport compare_logits(const core::Tensor& fused, const core::Tensor& standard, const ShadowTolerance& tol) {
  K3_CHECK(fused.dtype() == core::DType::f32 && standard.dtype() == core::DType::f32 && fused.shape().rank() == 2 &&
               standard.shape().rank() == 2 && fused.dim(0) == standard.dim(0) && fused.dim(1) == standard.dim(1) &&
               fused.view().device == core::Device::cpu && standard.view().device == core::Device::cpu,
           "shadow validation: the two paths' logits differ in shape or are not host f32 [rows, vocab]");
  ShadowReport r;
  r.rows = fused.dim(0);
  const int64_t V = fused.dim(1);
  for (int64_t row = 0; row < r.rows; ++row) {
    const float* f = fused.data<const float>() + row * V;
    const float* s = standard.data<const float>() + row * V;
    double dot = 0, ff = 0, ss = 0, max_abs = 0, scale = 0;
    float lo = s[0], hi = s[0];
    for (int64_t i = 0; i < V; ++i) {
      dot += double{f[i]} * s[i];
      ff += double{f[i]} * f[i];
      ss += double{s[i]} * s[i];
      max_abs = std::max(max_abs, std::abs(double{f[i]} - s[i]));
      scale = std::max(scale, std::abs(double{s[i]}));
      lo = std::min(lo, s[i]);
      hi = std::max(hi, s[i]);
    }
    // Both rows zero: identical. One zero: cosine 0.
    const double cosine = ff == 0 && ss == 0 ? 1 : ff == 0 || ss == 0 ? 0 : dot / std::sqrt(ff * ss);
    const double abs_rel = scale > 0 ? max_abs / scale : (max_abs > 0 ? 1 : 0);
    const int64_t top_f = argmax(f, V), top_s = argmax(s, V);
    const bool disagree = top_f != top_s;
    const bool beyond_tie = disagree && double{s[top_s]} - s[top_f] > tol.tie_rel * (double{hi} - lo);
    r.min_cosine = std::min(r.min_cosine, cosine);
    r.max_abs = std::max(r.max_abs, max_abs);
    r.max_abs_rel = std::max(r.max_abs_rel, abs_rel);
    r.top1_disagreements += disagree ? 1 : 0;
    // NaN fails every comparison: a NaN row diverges.
    const bool within = cosine >= tol.min_cosine && abs_rel <= tol.max_abs_rel && !beyond_tie;
    r.divergent_rows += within ? 0 : 1;
  }
  return r;
}

std::string summarize_kernels(const core::KernelList& calls) {
  std::vector<std::pair<const core::KernelCall*, int64_t>> seen;
  for (const core::KernelCall& c : calls) {
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& p) { return *p.first == c; });
    if (it == seen.end()) seen.emplace_back(&c, 1);
    else ++it->second;
  }
  std::string out;
  for (const auto& [c, n] : seen) {
    if (!out.empty()) out += ", ";
    out += c->op + "=" + c->impl + " x" + std::to_string(n);
  }
  return out;
}

void ShadowCounters::add(const ShadowReport& r) {
  ++steps;
  divergent_steps += r.diverged() ? 1 : 0;
  rows += r.rows;
  divergent_rows += r.divergent_rows;
  top1_disagreements += r.top1_disagreements;
  min_cosine = std::min(min_cosine, r.min_cosine);
  max_abs_rel = std::max(max_abs_rel, r.max_abs_rel);
  seconds += r.seconds;
}

}  // namespace k3::engine
