// core/step_route.h: the route a step takes through the model, chosen once when it is planned
// (scheduler/step_route.h) and followed by the executor and the model, and the count of the routes
// that ran. Here so that the scheduler, the engine, the model and the benchmarks share one type.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace k3::core {

// Which decode path runs a step: the standard ops, or (decode_backend = latency_specialized) the
// fused decode path, which computes the same function (fastpath/fused_decode.h).
enum class DecodePath : uint8_t { standard, fused };

// A step shape replayed as captured device work (model/decode_graphs.h): `batch` sequences of
// `rows` rows each (1: plain decode; R >= 2: the last token and R - 1 drafts of a verify).
struct GraphBucket {
  int32_t batch = 0, rows = 0;  // batch 0: the step runs eagerly
  bool captured() const { return batch > 0; }
  friend bool operator==(const GraphBucket&, const GraphBucket&) = default;
};

// How a step runs, chosen once when it is planned (scheduler/step_route.h) and followed by the
// executor and the model: the decode path, why the standard path runs a step the fused path was
// selected for (a short fixed phrase: the fallback metric's label and the log line; empty when
// the fused path runs it or was not selected), and the graph bucket.
struct StepRoute {
  DecodePath path = DecodePath::standard;
  std::string fallback;
  GraphBucket graph;
};

// Steps per decode path, and the fused path's fallbacks per reason, counted as steps run (the
// engine's, for the server's decode-path metrics).
struct DecodePathCounters {
  int64_t fused_steps = 0, standard_steps = 0;
  std::vector<std::pair<std::string, int64_t>> fallbacks;  // (reason, steps), first seen first
  // Counts one step that ran on `route`; true when it is the first fused step or the first step of
  // its fallback reason (worth one log line).
  bool count(const StepRoute& route);
};

}  // namespace k3::core
