// scheduler/step_route.h: the route of each step, chosen once when the step is planned.
//
// The executor describes what it can run once (ExecutionScope: the decode path it was built with,
// the fused path's scope, its captured-graph shapes); Scheduler::schedule routes every plan by it
// (route_step), and the executor and the model follow the plan's route without deciding again.
// The engine counts the routes that ran (core::DecodePathCounters: the server's decode-path
// metrics).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/step_route.h"

namespace k3::scheduler {

struct StepPlan;
using core::DecodePath;
using core::DecodePathCounters;
using core::GraphBucket;
using core::StepRoute;

struct ExecutionScope {
  // decode_backend = latency_specialized: the fused path serves the steps it covers.
  bool fused_selected = false;
  // Set: the fused path can serve no step of this executor (a fixed phrase, the fallback of every
  // step): an unsupported GPU or AttnRes schedule, decode context parallelism, no path attached.
  std::string fused_problem;
  int64_t fused_max_rows = 0;  // the most rows of one step the fused path serves
  // Captured graphs (0: every step eager): pure-decode steps of 1..graph_max_batch sequences with
  // one row each, or verify steps of equal row counts R >= 2 with batch * R <= graph_max_rows,
  // whose block tables are at most graph_max_blocks wide.
  int32_t graph_max_batch = 0;
  int32_t graph_max_rows = 0;
  int64_t graph_max_blocks = 0;
  // The kernels of the graphs captured so far (the executor's, updated as it captures; null: none):
  // a step routed to a captured bucket carries its graph's list (StepRoute::kernels).
  std::shared_ptr<const core::GraphKernels> graph_kernels;
  // Shadow validation (engine/shadow_validation.h): this share of the fused steps also runs the
  // standard path (0: none, 1: every one).
  double shadow_validate_rate = 0;
};

// Whether step number `step` is in the sampled share `rate` of steps: a fixed hash of the step
// number against the rate, so a run is reproducible and every TP rank, planning the same step,
// agrees.
bool shadow_sampled(uint64_t step, double rate);

// Fallback reasons of the routing itself (metric labels: short and fixed).
inline constexpr const char* kNotPureDecode = "prefill_or_mixed_step";
// The fused path's row limit: "more_than_<fused_max_rows>_rows".
std::string too_many_rows(int64_t fused_max_rows);

// The route of `plan` (its sequences, rows and tables) under `scope`: the fused path for a
// pure-decode step of at most fused_max_rows rows when it is selected and has no problem (else the
// standard path, with the reason when it was selected), the graph bucket of an eligible step, and
// the kernels of that bucket's graph on that path when it is captured.
StepRoute route_step(const StepPlan& plan, const ExecutionScope& scope);

}  // namespace k3::scheduler
