// model/fused_decode.h: the seam between Model and the latency_specialized decode path
// (fastpath/, which depends on model/, never the reverse).
//
// A Model built with decode_backend = latency_specialized is given a FusedDecode (made by
// fastpath::make_fused_decode). For every step Model::run_step asks it first: decide() says whether
// it serves the step and, when not, why (a short fixed phrase: it labels the fallback metric and
// the log line); run_step() then computes the step's logits, the same function as the standard
// path's run_step.
#pragma once
#include <string>

#include "model/decode_path_counters.h"
#include "model/layers/context.h"

namespace k3::model {

enum class LogitRows : uint8_t;

struct PathDecision {
  bool fused = false;
  std::string reason;  // why the standard path runs the step (empty when fused)
};

class FusedDecode {
 public:
  virtual ~FusedDecode() = default;
  virtual PathDecision decide(const ForwardContext& ctx, LogitRows rows) const = 0;
  // Same contract as Model::run_step (queues device work only, so it can be captured).
  virtual core::Tensor run_step(const ForwardContext& ctx, const core::TensorView& ids, LogitRows rows) const = 0;
};

}  // namespace k3::model
