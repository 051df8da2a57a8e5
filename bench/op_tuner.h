// bench/op_tuner.h: `k3bench_decode_gpu --tune FILE` writes a tuning table (kernels/tuning.h) from
// the op calls a real model makes. While installed on a registry (kernels::OpTuner), every call with
// two or more capable implementations has each of them timed on the call's own arguments: one
// warm-up each, then `runs` rounds that time every candidate once in turn (interleaved, so clock
// and thermal drift fall on all of them alike), each run after an L2 flush (the model streams its
// weights from HBM; a re-run would find them in L2), the median per candidate; then the chosen one
// runs as usual. The table ranks the implementations at each observed size by their summed time
// over the calls both could run, starting from the stated order (tuning/default.json) and leaving it
// only for a win larger than `margin` of the summed time, so noise never flips a choice; each rule
// covers the sizes from just above the previous observed size up to its own; sizes above the
// largest observed one are left to tuning/default.json.
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
  // Microseconds of one run of `run` (the caller flushes L2 first and waits for the device).
  using TimeUs = std::function<double(const std::function<void()>& run)>;
  OpTuningRecorder(TimeUs time_us, int runs) : time_us_(std::move(time_us)), runs_(runs) {}
  void observe(const std::string& op, const std::string& measure, int64_t size,
               const std::vector<Candidate>& candidates) override;

  // {"gpu", "ops": {op: {"measure", "rules": [{"sizes", "order"}]}}, "measurements": {op: [{"size",
  // "calls", "us": {impl: summed us}, "order"}]}}: parses as a kernels::TuningTable (extra keys are
  // kept as the record of what was measured). `stated` (tuning/default.json) gives each size's
  // starting order; an implementation moves ahead of another only when faster by more than
  // `margin` (0.03: 3%) of their summed time.
  nlohmann::json table(const std::string& gpu, const kernels::TuningTable& stated, double margin) const;

 private:
  struct Call {
    std::map<std::string, double> us;  // the capable implementations' median times
  };
  struct OpCalls {
    std::string measure;
    std::map<int64_t, std::vector<Call>> by_size;
  };
  TimeUs time_us_;
  int runs_;
  std::map<std::string, OpCalls> ops_;
};

// Microseconds of one run() between stream-ordered marks, after filling `flush` (null: none; make
// it larger than the L2) so that what run() reads comes from HBM; waits for the device.
double time_us_on(core::DeviceMemory& clock, const core::TensorView* flush, const std::function<void()>& run);

// The order of the implementations at one size. It starts from `stated` (names it lists, in its
// order; the others after them in order of first appearance), then moves a before b only when a's
// summed time over the calls both ran is below (1 - margin) x b's (a stable insertion by that
// comparison).
std::vector<std::string> rank_implementations(const std::vector<std::map<std::string, double>>& calls,
                                              const std::vector<std::string>& stated = {}, double margin = 0);

}  // namespace k3::bench
