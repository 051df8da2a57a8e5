// spec/speculation_gate_test.cpp: SpeculationGate against step times from a known cost model
// t(R) = a + b R: it drafts when the expected tokens per second beat plain decoding and stops when
// they do not (no acceptance; a large batch whose extra rows cost nearly a plain step each), probes
// plain steps before it can compare, and keeps re-measuring the losing choice now and then.
#include "spec/speculation_gate.h"

#include <gtest/gtest.h>

namespace k3::spec {
namespace {

// Runs `steps` decode steps of `batch` sequences that would draft `drafts` tokens yielding
// `expected` tokens, timing them with t(R) = a + b R; returns how many steps drafted.
int run(SpeculationGate& g, int steps, int64_t batch, int64_t drafts, double expected, double a, double b) {
  int drafted = 0;
  for (int i = 0; i < steps; ++i) {
    const bool d = g.should_draft(batch, drafts, expected);
    drafted += d;
    const int64_t rows = batch + (d ? drafts : 0);
    g.record(batch, rows, a + b * static_cast<double>(rows));
  }
  return drafted;
}

TEST(SpeculationGate, DraftsWhenItPaysAndStopsWhenItDoesNot) {
  // Batch 1, weights-bound (extra rows nearly free): 7 drafts, 5 expected tokens -> speculation.
  SpeculationGate g;
  EXPECT_GE(run(g, 200, 1, 7, 5.0, 1e-3, 2e-6), 190);
  EXPECT_NEAR(g.predicted_seconds(1, 8), 1e-3 + 8 * 2e-6, 1e-7) << "the fit recovers the cost model";
  // The same bucket with no acceptance (1 token per step either way): it stops drafting, except
  // for the refresh steps.
  const int64_t before = g.skipped_steps();
  EXPECT_LE(run(g, 640, 1, 7, 1.0, 1e-3, 2e-6), 640 / SpeculationGate::kRefreshEvery + 1);
  EXPECT_GE(g.skipped_steps() - before, 600);
}

TEST(SpeculationGate, ALargeBatchStopsPayingWhereRowsCostAlmostAStepEach) {
  // Batch 64 (bucket 64), compute-bound: t = 1 ms + 0.1 ms per row. 4 drafts per sequence with
  // half accepted: 192 tokens in 1 + 32 ms against 64 in 7.4 ms -> plain is faster.
  SpeculationGate g;
  EXPECT_LE(run(g, 400, 64, 256, 192.0, 1e-3, 1e-4), 400 / 8);
  // At batch 1 in the same gate (another bucket) the same acceptance pays: 3 tokens in 1.5 ms
  // against 1 in 1.1 ms.
  EXPECT_GE(run(g, 200, 1, 4, 3.0, 1e-3, 1e-4), 180);
}

TEST(SpeculationGate, ProbesPlainStepsBeforeComparingAndNeverGatesStepsWithoutDrafts) {
  SpeculationGate g;
  // No plain measurement yet: every kProbeEvery-th step is a plain probe until kMinSamples.
  int plain = 0;
  for (int i = 0; i < 40; ++i) {
    const bool d = g.should_draft(2, 8, 2.0);
    plain += !d;
    g.record(2, d ? 10 : 2, d ? 2e-3 : 1e-3);
  }
  EXPECT_GE(plain, SpeculationGate::kMinSamples);
  EXPECT_GT(g.predicted_seconds(2, 10), g.predicted_seconds(2, 2));
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(g.should_draft(2, 0, 2.0)) << "a step without drafts is not gated";
  // Bad records are ignored.
  g.record(0, 5, 1.0);
  g.record(4, 2, 1.0);
  g.record(4, 8, -1.0);
  EXPECT_LT(g.predicted_seconds(4, 8), 0) << "bucket 4 has no samples";
}

}  // namespace
}  // namespace k3::spec
