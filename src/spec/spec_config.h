// spec/spec_config.h: the engine's speculative-decoding settings (EngineConfig::speculative) and
// the drafter they name.
//
//   method none       plain decoding (one token per request per step)
//          ngram      prompt lookup over the request's own context (spec/ngram_drafter.h)
//          synthetic  benchmarks only: acceptance is FORCED to synthetic_acceptance_length - 1
//                     drafts per step, so outputs are not the model's distribution
//                     (spec/synthetic_drafter.h)
//          dspark     the DSpark draft model (src/draft/); built by its owner, not make_drafter
//          eagle3     an EAGLE-3 draft model (src/draft/eagle3_*); built by its owner too
//          (both model drafters need SpeculativeConfig::needs_draft_model's checkpoint)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "spec/drafter.h"

namespace k3::spec {

enum class SpecMethod : uint8_t { none, ngram, synthetic, dspark, eagle3 };
const char* to_string(SpecMethod m);
// "none" | "ngram" | "synthetic" | "dspark" | "eagle3"; throws core::Error naming the accepted values.
SpecMethod parse_spec_method(std::string_view name);

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::none;
  int32_t num_speculative_tokens = 0;       // K: drafts verified per request per step (1..32)
  int32_t synthetic_acceptance_length = 0;  // synthetic: AL in [1, K+1] tokens per step (0: K+1)
  int32_t ngram_min = 1, ngram_max = 4;     // ngram: n-gram sizes tried, longest first
  // Per-request draft length from recent acceptance (spec/draft_length.h); off: always K.
  bool adaptive = true;

  bool enabled() const { return method != SpecMethod::none && num_speculative_tokens > 0; }
  // dspark and eagle3 draft with a model of their own (a checkpoint folder).
  bool needs_draft_model() const { return method == SpecMethod::dspark || method == SpecMethod::eagle3; }
  // Throws core::Error naming the field and the allowed range.
  void validate() const;
};

std::string describe(const SpeculativeConfig& c);

// The drafter for ngram or synthetic; throws core::Error for none, dspark and eagle3 (whose drafters need
// the target model and its weights: src/draft/ builds it and hands it to the Engine).
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c);

}  // namespace k3::spec
