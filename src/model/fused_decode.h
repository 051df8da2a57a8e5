// model/fused_decode.h: the seam between Model and the latency_specialized decode path
// (fastpath/, which depends on model/, never the reverse).
//
// A Model built with decode_backend = latency_specialized is given a FusedDecode (made by
// fastpath::make_fused_decode). It describes its scope once (problem(), max_rows(): the executor
// hands them to the scheduler, which routes every step: scheduler/step_route.h), and runs the
// steps routed to it: run_step() computes the step's logits, the same function as the standard
// path's run_step, and refuses a step outside its scope.
#pragma once
#include <string>

#include "model/layers/context.h"

namespace k3::model {

enum class LogitRows : uint8_t;

class FusedDecode {
 public:
  virtual ~FusedDecode() = default;
  // Why it can serve no step of its model (a short fixed phrase: the fallback metric's label and
  // the log line), or "".
  virtual std::string problem() const = 0;
  // The most rows of a pure-decode step it serves.
  virtual int64_t max_rows() const = 0;
  // Same contract as Model::run_step (queues device work only, so it can be captured); throws
  // core::Error for a step outside its scope.
  virtual core::Tensor run_step(const ForwardContext& ctx, const core::TensorView& ids, LogitRows rows) const = 0;
};

}  // namespace k3::model
