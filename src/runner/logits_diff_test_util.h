// runner/logits_diff_test_util.h: what the tensor-parallel tests (tp_runner_test.cpp, tp_dcp_test.cpp,
// tp_dcp_naive_test.cpp, tp_ep_test.cpp) open their models with, compare logits with, and the random
// prompts they feed.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "model/layers/context.h"

namespace k3::runner::test_util {

// The TP tests' model options: buffers poisoned with NaN, so an unwritten activation (a missed slice,
// a route nobody summed, a skipped row) turns into NaN logits; decode context parallelism over `dcp`
// ranks; expert parallelism.
inline model::ModelOptions tp_test_options(kernels::Precision p, int dcp = 1, bool expert_parallel = false) {
  model::ModelOptions o;
  o.precision = p;
  o.poison_buffers = true;
  o.dcp = dcp;
  o.expert_parallel = expert_parallel;
  return o;
}

struct LogitsDiff {
  double rel = 0;      // max |a - b| / max |b| (a non-finite a counts as infinitely far)
  double top1 = 1;     // fraction of rows whose argmax agree
  double min_cos = 1;  // lowest per-row cosine
};

// a and b: f32 [rows, vocab] on the CPU, same shape.
inline LogitsDiff compare_logits(const core::Tensor& a, const core::Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const int64_t rows = a.dim(0), cols = a.dim(1);
  double max_abs = 0, scale = 0;
  int64_t agree = 0;
  LogitsDiff d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data<const float>() + r * cols;
    const float* y = b.data<const float>() + r * cols;
    double dot = 0, nx = 0, ny = 0;
    for (int64_t c = 0; c < cols; ++c) {
      max_abs = std::max(max_abs, std::isfinite(x[c]) ? std::fabs(double(x[c]) - y[c]) : INFINITY);
      scale = std::max(scale, std::fabs(double(y[c])));
      dot += double(x[c]) * y[c], nx += double(x[c]) * x[c], ny += double(y[c]) * y[c];
    }
    d.min_cos = std::min(d.min_cos, dot / std::sqrt(nx * ny + 1e-300));
    agree += std::max_element(x, x + cols) - x == std::max_element(y, y + cols) - y;
  }
  d.rel = max_abs / scale;
  d.top1 = rows ? double(agree) / double(rows) : 1.0;
  return d;
}

inline std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return t;
}

}  // namespace k3::runner::test_util
