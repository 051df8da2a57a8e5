// spec/draft_length.cpp: SpecCounters and DraftLengthController.
#include "spec/draft_length.h"

#include <algorithm>

namespace k3::spec {

void SpecCounters::record(int32_t proposed, int32_t accepted) {
  if (proposed <= 0) return;
  ++num_drafts;
  num_draft_tokens += proposed;
  num_accepted_tokens += accepted;
  if (accepted_per_pos.size() < static_cast<size_t>(proposed))
    accepted_per_pos.resize(static_cast<size_t>(proposed), 0);
  for (int32_t i = 0; i < accepted; ++i) ++accepted_per_pos[static_cast<size_t>(i)];
}

DraftLengthController::State DraftLengthController::fresh() const {
  State s{max_};
  s.rate = population_rate_;
  if (!adaptive_) return s;
  if (s.rate < kPauseBelowRate) s.length = 1;
  else if (s.rate < 0.3) s.length = std::max(1, max_ / 2);
  else if (s.rate < 0.6) s.length = std::max(1, max_ - 1);
  return s;
}

int32_t DraftLengthController::next(RequestId id) const {
  const auto it = per_request_.find(id);
  return it == per_request_.end() ? fresh().length : it->second.length;
}

int32_t DraftLengthController::take_step(RequestId id) {
  const auto it = per_request_.find(id);
  if (it == per_request_.end()) return fresh().length;
  State& s = it->second;
  if (s.length > 0) return s.length;
  if (s.pause_left-- > 0) return 0;
  s.length = 1;  // the pause is over: probe with one draft
  return 1;
}

double DraftLengthController::rate(RequestId id) const {
  const auto it = per_request_.find(id);
  return it == per_request_.end() ? population_rate_ : it->second.rate;
}

void DraftLengthController::record(RequestId id, int32_t proposed, int32_t accepted) {
  if (proposed <= 0) return;
  State& s = per_request_.try_emplace(id, fresh()).first->second;
  const double step_rate = static_cast<double>(accepted) / static_cast<double>(proposed);
  population_rate_ = 0.9 * population_rate_ + 0.1 * step_rate;
  s.rate = 0.7 * s.rate + 0.3 * step_rate;
  if (!adaptive_) return;
  if (accepted > 0) s.pause = kFirstPause;
  if (accepted == proposed) s.length = std::min(max_, s.length + 1);
  else if (s.length == 1 && s.rate < kPauseBelowRate) {
    s.length = 0;  // stop drafting for a while; a failed probe waits twice as long next time
    s.pause_left = s.pause;
    s.pause = std::min(kMaxPause, s.pause * 2);
  } else if (s.rate < 0.3) s.length = std::max(1, s.length / 2);
  else if (s.rate < 0.6) s.length = std::max(1, s.length - 1);
}

}  // namespace k3::spec
