// runner/sampler.h: per-request token sampling (greedy, temperature, top-k/top-p/min-p,
// penalties, logit_bias, logprobs), seeded and reproducible.
//
// Order of processing, for one row of logits x[vocab] (vLLM's order: grammar mask, bias and
// penalties, temperature, top-k/top-p, min-p):
//   0. allowed mask:        x[id] = -inf for every id a constrained request's grammar refuses
//                           (structured/matcher.h; bit id % 32 of word id / 32).
//   1. logit_bias:          x[id] += bias for every (id, bias) pair.
//   2. repetition_penalty:  for every id present in prompt OR output (once per id, however often
//                           it occurs): x > 0 ? x / penalty : x * penalty       (vLLM / HF).
//   3. frequency/presence:  for every id in output only, with c = its count in output:
//                           x -= frequency_penalty * c + presence_penalty * [c > 0]   (OpenAI).
//      The result of 0-3 is the "processed logits".
//   4. logprobs:            log_softmax(processed logits), BEFORE temperature and before any
//                           filter. The sampled token's logprob is always returned, plus the
//                           `logprobs` most likely tokens. A choice (vLLM v1 returns raw logprobs
//                           by default, processed ones on request): logprobs see what the request
//                           changed (bias, penalties) but not temperature, top-k, top-p or min-p,
//                           so they compare across sampling settings, and a token a filter
//                           removed still has its (finite) logprob.
//   5. temperature 0:       greedy: argmax of the processed logits, ties -> lowest id; no draw.
//      temperature T > 0:   p = softmax(processed / T), then
//   6. top-k:               keep exactly the k most likely (ties at the cut -> lower ids win;
//                           vLLM keeps every token tied with the k-th; k >= vocab keeps all),
//   7. top-p:               keep the shortest most-likely-first prefix whose mass reaches
//                           top_p * (mass left after top-k),
//   8. min-p:               keep tokens with p >= min_p * max(p),
//   9. sample:              one uniform draw from the Sampler's own Rng over the renormalised
//                           survivors, walked in ascending id order (the first id whose running
//                           mass exceeds u * total). Exactly one draw per sample() call when T > 0,
//                           none when T = 0, so a request's tokens depend only on its seed and its
//                           inputs (and not on the standard library's nth_element or heap order).
// With T = 0 the filters are legal and have no effect: each of them always keeps the argmax.
//
// Cost per call: O(vocab + |prompt| + |output|) expected, with no sort of the vocabulary:
// top-k is one pass with a heap of the k best, top-p a weighted selection (repeated halving with
// nth_element until the cut is found, then a sort of at most 32 tokens), and tokens that
// provably cannot reach the top-p cut are dropped before it. Scratch buffers are owned by
// the Sampler, sized to the vocabulary on first use and reused; only the ones the parameters
// need exist. At vocab 163840 each is 640 KB (seen_: 160 KB): none for greedy without
// penalties, one for T > 0, one more for top-k/top-p, one for logit_bias or any penalty,
// plus seen_ for repetition and one for presence/frequency: at most about 2.7 MB.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/rng.h"

namespace k3::runner {

inline constexpr int kMaxLogprobs = 20;        // like vLLM's default max_logprobs and OpenAI
inline constexpr float kMaxLogitBias = 100;    // |bias| bound, like OpenAI
inline constexpr float kMaxOpenAIPenalty = 2;  // |presence|, |frequency| bound, like OpenAI/vLLM

struct SamplingParams {
  float temperature = 0.0f;                                // finite, >= 0; 0 = greedy
  float top_p = 1.0f;                                      // (0, 1]; 1 = off
  int top_k = 0;                                           // 0 or -1 = off (-1 as in vLLM); >= 1 keeps k tokens
  float min_p = 0.0f;                                      // [0, 1]; 0 = off
  uint64_t seed = 0;                                       // every value is a fixed seed (0 included)
  float repetition_penalty = 1.0f;                         // finite, > 0; 1 = off; over prompt + output ids
  float presence_penalty = 0.0f;                           // [-2, 2]; over output ids
  float frequency_penalty = 0.0f;                          // [-2, 2]; over output ids
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // (id in [0, vocab), bias in [-100, 100]); ids unique
  int logprobs = 0;                                        // [0, 20] and <= vocab: how many top logprobs to return
  // Return the sampled token's logprob (implied by logprobs > 0). Off by default: it needs a
  // log-softmax over the whole vocabulary per token (docs/perf/kernel-notes.md, runner).
  bool logprob = false;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0;  // log_softmax(processed logits)[token] (step 4 above); NaN unless requested
  // The `logprobs` most likely tokens under the same distribution, most likely first,
  // ties -> lower id first.
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// Throws core::Error naming the parameter (and the value and the allowed range) when a value is
// out of range, NaN, or an unsupported combination (logit_bias id outside the vocabulary or
// listed twice, logprobs above 20 or above vocab_size).
void validate(const SamplingParams& params, int32_t vocab_size);

class Sampler {
 public:
  // Validates params (see validate) and seeds the Sampler's own Rng with params.seed.
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Picks the next token from one row of f32 logits [vocab_size]. `prompt` and `output` (the
  // tokens generated so far) feed the penalties; they are read, and their ids checked, only
  // when a penalty is on. `allowed` (empty: every token): the grammar's mask, [ceil(vocab / 32)]
  // words. Throws core::Error on a wrong logits or mask size, NaN or +inf logits, ids
  // outside the vocabulary, or when every processed logit is -inf.
  SampleResult sample(std::span<const float> logits, std::span<const int32_t> prompt, std::span<const int32_t> output,
                      std::span<const uint32_t> allowed = {});

  const SamplingParams& params() const { return params_; }

  // For the device sampler (runner/device_sampler.h, kernels/sampling): true when sample() needs
  // no step 1-3 (no logit_bias, no penalty), so the processed logits are the logits themselves.
  bool device_eligible() const;
  // The uniform sample() would draw in step 9, consuming the Rng exactly as sample() does: one
  // draw when temperature > 0, none (and 0 returned) when greedy.
  double draw_uniform();

 private:
  std::span<const float> process(std::span<const float> logits, std::span<const int32_t> prompt,
                                 std::span<const int32_t> output, std::span<const uint32_t> allowed);
  // Steps 5-9 for T > 0 over prob_ (filled by sample()); one Rng draw.
  int32_t draw(std::span<const float> x);

  SamplingParams params_;
  int32_t vocab_size_;
  int32_t top_k_;  // effective k: vocab_size when off or when k >= vocab
  core::Rng rng_;
  // Scratch, each [vocab_size] once used, reused across calls.
  std::vector<float> processed_;       // logits after steps 1-3 (only when a step is on)
  std::vector<int32_t> output_count_;  // per id count in output; all zero between calls
  std::vector<uint8_t> seen_;          // repetition-penalty marks; all zero between calls
  std::vector<float> prob_;            // exp((x - max x) / T) per id, T > 0 only
  std::vector<int32_t> order_;         // candidate ids for top-k / top-p / min-p
};

}  // namespace k3::runner
