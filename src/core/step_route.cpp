// core/step_route.cpp: DecodePathCounters.
#include "core/step_route.h"

namespace k3::core {

bool DecodePathCounters::count(const StepRoute& route) {
  const bool fused = route.path == DecodePath::fused;
  int64_t& total = fused ? fused_steps : standard_steps;
  ++total;
  if (fused) return total == 1;
  if (route.fallback.empty()) return false;  // the standard path was the choice, not a fallback
  for (auto& [reason, n] : fallbacks)
    if (reason == route.fallback) {
      ++n;
      return false;
    }
  fallbacks.emplace_back(route.fallback, 1);
  return true;
}

}  // namespace k3::core
