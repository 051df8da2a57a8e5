// tests/test_util.h: temporary checkpoints and logit comparisons for the end-to-end tests.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace k3::testing {

// A fresh folder under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("k3serve-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::filesystem::path write_checkpoint(const TempDir& dir, const config::K3Config& cfg,
                                              checkpoint::WriteOptions opt = {}, const std::string& name = "model") {
  const auto out = dir.path() / name;
  checkpoint::write_random_checkpoint(cfg, opt, out);
  return out;
}

// n token ids drawn uniformly from [0, vocab) with core::Rng(seed).
inline std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return t;
}

struct Diff {
  double max_abs = 0, scale = 0, cosine = 1, top1_agreement = 1;
  double rel() const { return scale > 0 ? max_abs / scale : max_abs; }
};

// Compares two [rows, cols] f32 tensors row by row: max |a-b|, max |b| (scale), the lowest
// per-row cosine, and the fraction of rows whose argmax agree.
inline Diff compare(const core::Tensor& a, const core::Tensor& b) {
  Diff d;
  const int64_t rows = a.dim(0), cols = a.dim(1);
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data<const float>() + r * cols;
    const float* y = b.data<const float>() + r * cols;
    double dot = 0, nx = 0, ny = 0;
    int64_t ax = 0, ay = 0;
    for (int64_t c = 0; c < cols; ++c) {
      d.max_abs = std::max(d.max_abs, std::isfinite(x[c] - y[c]) ? std::fabs(double(x[c]) - y[c]) : INFINITY);
      d.scale = std::max(d.scale, std::fabs(double(y[c])));
      dot += double(x[c]) * y[c];
      nx += double(x[c]) * x[c];
      ny += double(y[c]) * y[c];
      if (x[c] > x[ax]) ax = c;
      if (y[c] > y[ay]) ay = c;
    }
    d.cosine = std::min(d.cosine, dot / std::sqrt(nx * ny + 1e-300));
    agree += ax == ay;
  }
  d.top1_agreement = rows ? double(agree) / double(rows) : 1.0;
  return d;
}

}  // namespace k3::testing
