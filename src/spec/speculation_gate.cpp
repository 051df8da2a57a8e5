// spec/speculation_gate.cpp: SpeculationGate (see speculation_gate.h).
#include "spec/speculation_gate.h"

#include <algorithm>
#include <bit>

namespace k3::spec {

int SpeculationGate::bucket(int64_t batch) {
  const auto b = static_cast<uint64_t>(std::max<int64_t>(batch, 1));
  return std::min(kBuckets - 1, static_cast<int>(std::bit_width(b - 1)));  // ceil(log2 b)
}

double SpeculationGate::predict(const Fit& f, double rows) {
  const double mr = f.r / f.w, mt = f.t / f.w, var = f.rr / f.w - mr * mr;
  // All samples at one row count (e.g. every verify step drafted the same): no slope to fit.
  const double slope = var > 1e-9 * std::max(1.0, mr * mr) ? (f.rt / f.w - mr * mt) / var : 0.0;
  return mt + slope * (rows - mr);
}

double SpeculationGate::predicted_seconds(int64_t batch, int64_t rows) const {
  const Fit& f = fits_[static_cast<size_t>(bucket(batch))];
  return fitted(f) ? predict(f, static_cast<double>(rows)) : -1.0;
}

bool SpeculationGate::should_draft(int64_t batch, int64_t drafts, double expected_tokens) {
  Fit& f = fits_[static_cast<size_t>(bucket(batch))];
  const int64_t step = f.steps++;
  bool draft = true;
  if (drafts <= 0) {
    draft = true;  // nothing to verify: the step is plain either way
  } else if (f.verify < kMinSamples) {
    draft = true;  // measure verify steps first (optimistic)
  } else if (f.plain < kMinSamples) {
    draft = step % kProbeEvery != 0;  // an occasional plain step to measure the alternative
  } else {
    const double t_plain = predict(f, static_cast<double>(batch));
    const double t_spec = predict(f, static_cast<double>(batch + drafts));
    const bool pays = t_spec > 0 && t_plain > 0 &&
                      expected_tokens / t_spec >= margin_ * static_cast<double>(batch) / t_plain;
    draft = step % kRefreshEvery == 0 ? !pays : pays;  // now and then the other choice, to keep both measured
  }
  if (!draft) ++skipped_;
  return draft;
}

void SpeculationGate::record(int64_t batch, int64_t rows, double seconds) {
  if (batch <= 0 || rows < batch || !(seconds > 0)) return;
  Fit& f = fits_[static_cast<size_t>(bucket(batch))];
  const double r = static_cast<double>(rows);
  f.w = kDecay * f.w + 1;
  f.r = kDecay * f.r + r;
  f.t = kDecay * f.t + seconds;
  f.rr = kDecay * f.rr + r * r;
  f.rt = kDecay * f.rt + r * seconds;
  if (rows == batch) ++f.plain;
  else ++f.verify;
}

}  // namespace k3::spec
