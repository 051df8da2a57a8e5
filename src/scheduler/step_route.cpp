// scheduler/step_route.cpp: route_step.
#include "scheduler/step_route.h"

#include "scheduler/step_plan.h"

namespace k3::scheduler {

std::string too_many_rows(int64_t fused_max_rows) { return "more_than_" + std::to_string(fused_max_rows) + "_rows"; }

bool shadow_sampled(uint64_t step, double rate) {
  if (rate <= 0) return false;
  if (rate >= 1) return true;
  uint64_t z = step + 0x9E3779B97F4A7C15ull;  // splitmix64: consecutive steps spread evenly
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 < rate;
}

namespace {
// The captured-graph bucket of a pure-decode step, or none: every sequence plain with one row, or
// every one a verify of the same R >= 2 rows.
GraphBucket graph_bucket(const StepPlan& plan, const ExecutionScope& scope) {
  const auto B = static_cast<int32_t>(plan.seqs.size());
  if (scope.graph_max_batch == 0 || B == 0 || B > scope.graph_max_batch || plan.num_prefills > 0) return {};
  const ScheduledSequence& first = plan.seqs.front();
  const int32_t R = first.num_tokens;
  if (first.verify() ? R < 2 || int64_t{B} * R > scope.graph_max_rows : R != 1) return {};
  for (const ScheduledSequence& q : plan.seqs)
    if (q.kind != StepKind::decode || q.verify() != first.verify() || q.num_tokens != R ||
        q.num_blocks > scope.graph_max_blocks)
      return {};
  return {B, R};
}
}  // namespace

StepRoute route_step(const StepPlan& plan, const ExecutionScope& scope) {
  StepRoute route;
  if (plan.empty()) return route;  // nothing runs (every candidate was preempted)
  route.graph = graph_bucket(plan, scope);
  if (scope.fused_selected) {
    if (!scope.fused_problem.empty()) route.fallback = scope.fused_problem;
    else if (plan.num_prefills > 0) route.fallback = kNotPureDecode;
    else if (plan.num_tokens > scope.fused_max_rows) route.fallback = too_many_rows(scope.fused_max_rows);
    else route.path = DecodePath::fused;
  }
  route.shadow = route.path == DecodePath::fused && shadow_sampled(plan.step, scope.shadow_validate_rate);
  if (route.graph.captured() && scope.graph_kernels) route.kernels = scope.graph_kernels->find(route.path, route.graph);
  return route;
}

}  // namespace k3::scheduler
