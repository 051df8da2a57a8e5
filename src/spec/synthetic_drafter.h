// spec/synthetic_drafter.h: the SYNTHETIC drafter, for benchmarks of the verify path only.
//
// It proposes max_drafts copies of the request's last token (any tokens would do) and says
// synthetic() = true: the engine then ignores the target's verdict and accepts exactly
// min(AL - 1, drafts) of them per step (spec::accept_synthetic), then emits the target's own
// token at the next position. So every step yields min(AL, drafts + 1) tokens whatever the model
// says: the step costs and cache traffic of a real drafter with acceptance length AL, but the
// OUTPUTS ARE NOT THE MODEL'S DISTRIBUTION (the accepted "drafts" are filler). Stats, metrics and
// log lines label this mode "synthetic".
#pragma once
#include "spec/drafter.h"

namespace k3::spec {

class SyntheticDrafter final : public Drafter {
 public:
  // acceptance_length: tokens per verify step, >= 1 (1: every draft rejected).
  explicit SyntheticDrafter(int32_t acceptance_length);

  std::string name() const override { return "synthetic"; }
  bool synthetic() const override { return true; }
  int32_t acceptance_length() const { return acceptance_length_; }
  void propose(std::span<const DraftQuery> batch, std::span<Draft> out) override;

 private:
  int32_t acceptance_length_;
};

}  // namespace k3::spec
