// spec/speculation_gate.h: whether drafting pays for the next decode step, from measured step times.
//
// A verify step is not free: it runs K + 1 rows per sequence (the MoE reads more experts, attention
// reads the context once per row), samples on the host and replays the accepted rows into the KDA
// state, and the drafter itself costs time. At large batch or long context the extra rows cost
// nearly as much as plain steps (TokenSpeed measured 0.73x at 128K context with acceptance 1.0), so
// per-request acceptance alone (spec/draft_length.h) cannot tell when speculation stops paying.
//
// Model. Per batch bucket (the number of decoding sequences B, rounded up to a power of two) the
// gate keeps exponentially weighted least squares of step time against rows, t(R) = a + b R,
// fitted from every pure decode step the engine reports (plain steps have R = B, verify steps
// R = B + drafts), and separately the mean extra time of a drafting step (the drafter's propose()
// and the host sampling it implies) over a plain one, folded into `a` by the fit. A step with
// planned drafts D and expected tokens E (sum over requests of 1 + the accepted drafts the request's
// acceptance rate predicts) pays when
//     E / t(B + D)  >=  margin * B / t(B)
// Exploration: a bucket with no verify measurements drafts (optimistic); a bucket that has not
// measured plain steps forces a plain step every kProbeEvery steps until it has kMinSamples of them;
// once fitted, the losing choice is still taken every kRefreshEvery steps so the fit follows changes
// (longer contexts, another mix of requests).
#pragma once
#include <array>
#include <cstdint>

namespace k3::spec {

class SpeculationGate {
 public:
  static constexpr int kBuckets = 12;  // B = 1, 2, 4, ..., 2048
  static constexpr int kMinSamples = 3;
  static constexpr int64_t kProbeEvery = 8;
  static constexpr int64_t kRefreshEvery = 64;
  static constexpr double kDecay = 0.95;  // weight of the older samples per new one

  // margin > 1 asks speculation to be that much faster before it runs.
  explicit SpeculationGate(double margin = 1.0) : margin_(margin) {}

  // Whether to draft for a decode step of `batch` sequences that would verify `drafts` draft
  // tokens in all and is expected to yield `expected_tokens` tokens (>= batch). Advances the
  // bucket's step counter (probes and refreshes are counted per bucket).
  bool should_draft(int64_t batch, int64_t drafts, double expected_tokens);
  // A pure decode step ran: `batch` sequences, `rows` token rows (batch + verified drafts), in
  // `seconds` (the whole step: drafting, forward, sampling, commit).
  void record(int64_t batch, int64_t rows, double seconds);

  // The fitted step time for `rows` rows at `batch` sequences, or < 0 before the bucket has both
  // plain and verify samples (tests, logs).
  double predicted_seconds(int64_t batch, int64_t rows) const;
  int64_t skipped_steps() const { return skipped_; }

 private:
  struct Fit {  // exponentially weighted sums of (R, t)
    double w = 0, r = 0, t = 0, rr = 0, rt = 0;
    int plain = 0, verify = 0;  // samples of each kind (not decayed)
    int64_t steps = 0;          // should_draft calls
  };
  static int bucket(int64_t batch);
  bool fitted(const Fit& f) const { return f.plain >= kMinSamples && f.verify >= kMinSamples; }
  static double predict(const Fit& f, double rows);

  double margin_;
  std::array<Fit, kBuckets> fits_{};
  int64_t skipped_ = 0;
};

}  // namespace k3::spec
