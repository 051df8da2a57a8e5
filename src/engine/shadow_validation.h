// engine/shadow_validation.h: shadow validation of the fused decode path on live traffic.
//
// With EngineConfig::shadow_validate_rate R > 0, a sampled share R of the steps routed to the
// fused path (core::StepRoute::shadow, chosen when the step is planned: scheduler/step_route.h)
// also run the standard path on the same inputs, beside the fused step. The client gets the fused
// step's logits as without it: the shadow runs first, its sequences in verify mode (the KDA slots
// keep their committed state) on copies of their states, and the fused step then rewrites the one
// MLA row per sequence the shadow wrote. The two logits are compared here; the engine counts the
// results (EngineStats::shadow, the server's k3serve:shadow_* metrics) and logs a divergence with
// the step's shapes and the kernels that ran.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/step_route.h"
#include "core/tensor.h"

namespace k3::engine {

// What a row's fused logits may differ from the standard path's (spec: bf16 rounding points are
// the same, the fused kernels only reorder sums). A row diverges when its cosine is below
// min_cosine, or its largest difference exceeds max_abs_rel times the row's largest |logit|, or the
// two top-1 tokens differ and the standard path ranks the fused choice more than tie_rel times its
// logit range below its own (a near tie may flip either way).
struct ShadowTolerance {
  double min_cosine = 0.999;
  double max_abs_rel = 0.05;
  double tie_rel = 0.01;
};
// The tolerance of a model run in bf16 (the default above) or fp32 (the two paths agree to
// reassociation: 1e-5 of the scale).
ShadowTolerance shadow_tolerance(bool fp32);

// One shadow-validated step.
struct ShadowReport {
  int64_t rows = 0;
  int64_t top1_disagreements = 0;  // rows whose top-1 token differs (near ties included)
  int64_t divergent_rows = 0;      // rows outside the tolerance
  double min_cosine = 1;           // over the rows
  double max_abs = 0;              // largest |fused - standard| over the rows
  double max_abs_rel = 0;          // ... over the row's largest |standard logit|, the worst row
  double seconds = 0;              // the shadow step's own time
  std::string shapes;              // the step: sequences, rows, contexts, graph bucket
  std::string kernels;             // the fused step's kernels: "op=impl xN, ..." in first-call order
  bool diverged() const { return divergent_rows > 0; }
};

// Compares host f32 logits [rows, vocab] of the two paths row by row.
ShadowReport compare_logits(const core::Tensor& fused, const core::Tensor& standard, const ShadowTolerance& tol);

// "op=impl xN, ..." : each (op, implementation) pair once, in first-call order, with its count.
std::string summarize_kernels(const core::KernelList& calls);

// Totals over the steps validated so far (the engine's; the server's /metrics).
struct ShadowCounters {
  int64_t steps = 0, divergent_steps = 0;
  int64_t rows = 0, divergent_rows = 0, top1_disagreements = 0;
  double min_cosine = 1, max_abs_rel = 0;
  double seconds = 0;
  void add(const ShadowReport& r);
};

}  // namespace k3::engine
