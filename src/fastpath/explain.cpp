// fastpath/explain.cpp: a step's plan as text (--explain).
#include <sstream>
#include <vector>

#include "fastpath/fused_decode.h"

namespace k3::fastpath {

std::string explain_step(const core::StepRoute& route, std::span<const kernels::OpRecorder::Call> calls,
                         int num_layers) {
  std::ostringstream o;
  o << "decode path " << (route.path == core::DecodePath::fused ? "latency_specialized (fused)" : "standard");
  if (!route.fallback.empty()) o << ", fallback: " << route.fallback;
  if (route.graph.captured()) o << ", graph " << route.graph.batch << "x" << route.graph.rows;
  o << "; " << calls.size() << " op calls";
  if (num_layers > 0) o << " (" << static_cast<double>(calls.size()) / num_layers << " per layer)";
  o << "\n";
  // Each distinct (op, device, implementation) once, in the order first run, with its count.
  struct Row {
    const kernels::OpRecorder::Call* call;
    int64_t count;
  };
  std::vector<Row> rows;
  for (const auto& c : calls) {
    bool found = false;
    for (Row& r : rows)
      if (r.call->op == c.op && r.call->impl == c.impl && r.call->device == c.device) {
        ++r.count;
        found = true;
        break;
      }
    if (!found) rows.push_back({&c, 1});
  }
  for (const Row& r : rows)
    o << "  " << r.call->op << " -> " << r.call->device << "/" << r.call->impl << " x" << r.count << "\n";
  return o.str();
}

}  // namespace k3::fastpath
