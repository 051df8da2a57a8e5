// bench/op_tuner.h: `k3bench_decode_gpu --tune FILE` writes a tuning table (kernels/tuning.h) from
// the op calls a real model makes. While installed on a registry (kernels::OpTuner), every call with
// two or more capable implementations has each of them timed on the call's own arguments (by
// `median_us`: median_us_on() times one warm-up and the median of N runs with core::DeviceMemory's
// stream-ordered marks); then the chosen one runs as usual. The table ranks the implementations at each observed size by their summed time
// over the calls both could run, and each rule covers the sizes from just above the previous
// observed size up to its own; sizes above the largest observed one are left to
// tuning/default.json.
//
// Timing re-runs in-place ops (state updates, cache writes) on the step's tensors: a tuning step
// leaves the model's state unusable, so the sweep runs it apart from the timed rows.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_memory.h"
#include "kernels/registry.h"

namespace k3::bench {

class OpTuningRecorder final : public kernels::OpTuner {
 public:
  using MedianUs = std::function<double(const std::function<void()>& run)>;
  explicit OpTuningRecorder(MedianUs median_us) : median_us_(std::move(median_us)) {}
  void observe(const std::string& op, const std::string& measure, int64_t size,
               const std::vector<Candidate>& candidates) override;

  // {"gpu", "ops": {op: {"measure", "rules": [{"sizes", "order"}]}}, "measurements": {op: [{"size",
  // "calls", "us": {impl: summed us}}]}}: parses as a kernels::TuningTable (extra keys are kept
  // as the record of what was measured).
  nlohmann::json table(const std::string& gpu) const;

 private:
  struct Call {
    std::map<std::string, double> us;  // the capable implementations' median times
  };
  struct OpCalls {
    std::string measure;
    std::map<int64_t, std::vector<Call>> by_size;
  };
  MedianUs median_us_;
  std::map<std::string, OpCalls> ops_;
};

// Microseconds of run(): one warm-up, then the median of `runs` runs between stream-ordered marks.
double median_us_on(core::DeviceMemory& clock, int runs, const std::function<void()>& run);

// The order of the implementations at one size: a before b when a's summed time is lower over the
// calls both ran (a stable insertion by that comparison; names only one call offered keep the
// order of their first appearance among equals).
std::vector<std::string> rank_implementations(const std::vector<std::map<std::string, double>>& calls);

}  // namespace k3::bench
