// runner/sampler.h: per-request token sampling, seeded and reproducible.
//
// temperature 0 is greedy (ties: lowest id). Otherwise softmax(logits / T), then the
// top-k, top-p and min-p filters, renormalised, and one draw from the request's own Rng.
#pragma once
#include <cstdint>
#include <span>

#include "core/rng.h"

namespace k3::runner {

struct SamplingParams {
  float temperature = 0.0f;  // >= 0; 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = 0;             // >= 0; 0 = off
  float min_p = 0.0f;        // [0, 1]
  uint64_t seed = 0;
};

// Throws core::Error naming the parameter when a value is out of range.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks a token id from one row of f32 logits. Throws on NaN logits.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  core::Rng rng_;
};

}  // namespace k3::runner
