// core/step_route.h: the route a step takes through the model, chosen once when it is planned
// (scheduler/step_route.h) and followed by the executor and the model, and the count of the routes
// that ran. Here so that the scheduler, the engine, the model and the benchmarks share one type.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
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

// One op call of a step: the op table and the implementation that ran (kernels/op_table.h).
struct KernelCall {
  std::string op, impl;
  friend bool operator==(const KernelCall&, const KernelCall&) = default;
};
// A step's op calls in call order (a composite op's parts right after it).
using KernelList = std::vector<KernelCall>;

// The kernels of each captured graph, per (decode path, bucket): written by model::DecodeGraphs
// when it captures a bucket's graph (the implementations the tuning tables chose for that shape,
// fixed from then on: a replay runs exactly these) and erased when it drops the graph; read when a
// step is routed, so the plan of every replayed step names the kernels it runs. Thread-safe: the
// executor writes while a scheduler may route the next step.
class GraphKernels {
 public:
  void publish(DecodePath path, GraphBucket bucket, std::shared_ptr<const KernelList> kernels) {
    std::lock_guard lk(mu_);
    by_shape_[key(path, bucket)] = std::move(kernels);
  }
  void erase(DecodePath path, GraphBucket bucket) {
    std::lock_guard lk(mu_);
    by_shape_.erase(key(path, bucket));
  }
  // nullptr: no graph of that shape is captured now.
  std::shared_ptr<const KernelList> find(DecodePath path, GraphBucket bucket) const {
    std::lock_guard lk(mu_);
    const auto it = by_shape_.find(key(path, bucket));
    return it == by_shape_.end() ? nullptr : it->second;
  }

 private:
  static std::tuple<int, int32_t, int32_t> key(DecodePath path, GraphBucket b) {
    return {static_cast<int>(path), b.batch, b.rows};
  }
  mutable std::mutex mu_;
  std::map<std::tuple<int, int32_t, int32_t>, std::shared_ptr<const KernelList>> by_shape_;
};

// How a step runs, chosen once when it is planned (scheduler/step_route.h) and followed by the
// executor and the model: the decode path, why the standard path runs a step the fused path was
// selected for (a short fixed phrase: the fallback metric's label and the log line; empty when
// the fused path runs it or was not selected), the graph bucket, and the kernels.
struct StepRoute {
  DecodePath path = DecodePath::standard;
  std::string fallback;
  GraphBucket graph;
  // Each op's chosen implementation, in call order, for a step of a bucket whose graph is captured
  // (GraphKernels): the replay runs exactly these, and DecodeGraphs refuses a plan whose list is
  // not its graph's. Null for the steps whose kernels are chosen per call as they run, from the
  // same tuning tables: eager steps, and the first step of a bucket (it captures the graph).
  std::shared_ptr<const KernelList> kernels;
  // Shadow validation (engine/shadow_validation.h): a fused step sampled to run the standard path
  // on the same inputs beside it, for comparison only.
  bool shadow = false;
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
