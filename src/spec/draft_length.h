// spec/draft_length.h: per-request adaptive draft length and acceptance statistics.
//
// A request starts from what the drafter has recently achieved over all requests: the population
// rate, an EWMA over every verify step (p <- 0.9 p + 0.1 (a / k), starting at 1), as its rate,
// and the length the rules below give that rate (K at p >= 0.6, K - 1 from 0.3, K / 2 from 0.1,
// else 1: a probe). Short requests (a chat answer of 20 tokens) end before their own rate could
// learn anything, so starting each at K with rate 1 made every one of them pay full verify steps:
// n-gram on chat prompts at 10% acceptance ran at 0.73x of no speculation on the CPU before this
// (docs/perf/spec_decode.md). After every verify step with k > 0 drafts of which a were accepted,
// rate <- 0.7 rate + 0.3 (a / k), and
//   a == k (all accepted)          length <- min(K, length + 1)
//   rate < 0.3                     length <- max(1, length / 2)
//   rate < 0.6                     length <- max(1, length - 1)
// so a request whose drafts keep failing verifies few rows (cheap steps) and one whose drafts
// keep succeeding verifies K. Steps where the drafter proposed nothing change nothing.
// A request at length 1 whose rate falls below 0.1 stops drafting: it decodes plainly for a pause
// of 8 steps, then probes with one draft; a probe that fails doubles the pause (up to 64 steps),
// one that is accepted ends the pausing (pause back to 8, the rate recovers through the EWMA).
// A verify step costs more than a plain decode step (K+1 rows, the KDA commit), so with drafts
// that never match (random text, an unrelated drafter) speculation must cost about nothing, not
// a fixed overhead per token: before this pause existed, n-gram drafting at 0% acceptance was
// clearly slower per token than no speculation (measurements: docs/perf/serving_h200.md, the
// n-gram drafter at concurrency 1).
// With adaptation off the length stays K.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "spec/drafter.h"

namespace k3::spec {

// Counters of verify steps (the engine's, per request and in total).
struct SpecCounters {
  int64_t num_drafts = 0;                 // verify steps with at least one draft
  int64_t num_draft_tokens = 0;           // drafts verified
  int64_t num_accepted_tokens = 0;        // drafts accepted
  std::vector<int64_t> accepted_per_pos;  // [K]: position i (0-based) accepted this many times
  void record(int32_t proposed, int32_t accepted);
  // Mean tokens per verify step (accepted + 1); 0 before the first.
  double mean_acceptance_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / static_cast<double>(num_drafts) : 0.0;
  }
};

class DraftLengthController {
 public:
  DraftLengthController(int32_t max_drafts, bool adaptive) : max_(max_drafts), adaptive_(adaptive) {}

  int32_t max_drafts() const { return max_; }
  // The draft budget of the request's next step (a new request's from the population rate),
  // without advancing a pause.
  int32_t next(RequestId id) const;
  // The draft budget of the request's step about to be planned: next(id), and a paused request's
  // pause advances by one step (0 while paused; 1, the probe, on the step the pause ends).
  int32_t take_step(RequestId id);
  void record(RequestId id, int32_t proposed, int32_t accepted);
  void release(RequestId id) { per_request_.erase(id); }
  double rate(RequestId id) const;  // a request's acceptance EWMA (a new one's: the population rate)
  double population_rate() const { return population_rate_; }
  size_t num_tracked() const { return per_request_.size(); }

 private:
  static constexpr double kPauseBelowRate = 0.1;
  static constexpr int32_t kFirstPause = 8, kMaxPause = 64;
  struct State {
    int32_t length;  // 0 while paused
    double rate = 1.0;
    int32_t pause_left = 0;       // plain-decode steps left before the probe
    int32_t pause = kFirstPause;  // length of the next pause
  };
  State fresh() const;  // a new request's state, from the population rate

  int32_t max_;
  bool adaptive_;
  double population_rate_ = 1.0;
  std::unordered_map<RequestId, State> per_request_;
};

}  // namespace k3::spec
