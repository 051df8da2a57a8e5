// engine/one_shot.h: the whole-sequence jobs of the CLI, tests and benchmarks, each run as one
// request of its own Engine over a loaded model (runner::ModelRunner, or runner::TpRunner's ranks
// through TpExecutor): the scheduler, cache, executor and sampler that serve requests, so there is
// one generation loop.
//
//   generate(runner, prompt, max_tokens, sampling)  the prompt prefilled in one step, then up to
//                                                   max_tokens sampled tokens (the last may be eos)
//   logits(runner, tokens, decode_from)             teacher-forced logits [T, vocab]: the first
//                                                   decode_from tokens as one prefill returning
//                                                   every row, then each later token forced, one
//                                                   decode step at a time
//
// The engine's cache holds that one sequence (pages of 16 tokens per rank, one KDA slot, no prefix
// cache); steps run eagerly (no CUDA graphs) on the caller's thread, and a failed step throws
// core::Error with the step's error.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/step_route.h"
#include "core/tensor.h"
#include "runner/sampler.h"

namespace k3::runner {
class ModelRunner;
class TpRunner;
}  // namespace k3::runner

namespace k3::engine {

struct GenerateStats {
  double prefill_seconds = 0, decode_seconds = 0;  // submission to the first token; the rest
  int64_t prompt_tokens = 0, generated_tokens = 0;
  core::DecodePathCounters decode_paths;  // the routes of the steps that ran
};

// `on_token` sees each new id as soon as it exists. `explain` (--explain) gets the plan of the
// prefill step and of the first decode step (fastpath::explain_step: the decode path and why, every
// op with the implementation that ran).
std::vector<int32_t> generate(runner::ModelRunner& runner, std::span<const int32_t> prompt, int64_t max_tokens,
                              const runner::SamplingParams& sampling,
                              const std::function<void(int32_t)>& on_token = nullptr, GenerateStats* stats = nullptr,
                              const std::function<void(const std::string&)>& explain = nullptr);
std::vector<int32_t> generate(const runner::TpRunner& runner, std::span<const int32_t> prompt, int64_t max_tokens,
                              const runner::SamplingParams& sampling,
                              const std::function<void(int32_t)>& on_token = nullptr, GenerateStats* stats = nullptr);

// decode_from in [1, T]: the first token is always a prefill (T: all prefill). `paths`: the routes
// of the steps that ran.
core::Tensor logits(const runner::ModelRunner& runner, std::span<const int32_t> tokens, int64_t decode_from,
                    core::DecodePathCounters* paths = nullptr);
core::Tensor logits(const runner::TpRunner& runner, std::span<const int32_t> tokens, int64_t decode_from,
                    core::DecodePathCounters* paths = nullptr);

}  // namespace k3::engine
