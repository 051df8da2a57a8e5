// spec/acceptance.h: deciding which drafts the target accepts (lossless speculative decoding).
//
// Verify rows: row j (j = 0..k) of a request's verify step holds the target's logits for the
// position after [last token, d_1..d_j], i.e. the distribution of the token that follows d_j.
//
// Point-mass drafts (a deterministic drafter: q = delta(d_j)), accept_point_mass:
//   for j = 0..k: t_j = Sampler::sample(row j, prompt, output ++ d_1..d_j)
//                 j < k and t_j == d_{j+1}: accept d_{j+1}, go on; else emit t_j and stop.
//   * temperature 0: t_j is the argmax of the processed logits: the greedy rule (longest prefix of
//     drafts equal to the target's argmax, then the target's token at the first mismatch, or the
//     bonus token after all k).
//   * temperature > 0: this IS standard speculative rejection sampling for q = delta(d): accept d
//     with probability p(d) (p = the request's Sampler pipeline: penalties, temperature,
//     top-k/p, min-p), and on rejection draw from the residual normalize(max(0, p - q)) = p with d
//     removed. Drawing t ~ p and accepting iff t == d gives exactly that: P(accept) = p(d), and
//     t | t != d ~ p restricted to the other tokens. The bonus token after k acceptances is
//     drawn from row k. One Rng draw per emitted token, from the request's own seeded Rng, in
//     the same order as plain decoding: a request's sampled tokens are IDENTICAL with and without
//     speculation for the same seed (and greedy ones are identical by construction).
//
// Drafts with distributions q (model drafters sampling their drafts): rejection_step below, with
// p from the target row (Sampler::probabilities where available) and explicit uniforms.
//
// Synthetic mode (benchmarks, NOT the model's distribution): accept_synthetic accepts
// min(AL - 1, k) drafts unconditionally, then samples the target's token at that row.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "runner/sampler.h"

namespace k3::spec {

struct Verified {
  int32_t num_accepted = 0;                  // drafts accepted (0..k)
  std::vector<runner::SampleResult> tokens;  // num_accepted drafts, then the target's token
};

// `rows`: f32 [drafts.size() + 1, vocab] row-major. `scratch` is reused for output ++ drafts.
void accept_point_mass(runner::Sampler& sampler, std::span<const float> rows, int32_t vocab,
                       std::span<const int32_t> prompt, std::span<const int32_t> output,
                       std::span<const int32_t> drafts, Verified& result, std::vector<int32_t>& scratch);

// SYNTHETIC: the first min(acceptance_length - 1, k) drafts are accepted whatever the target says
// (their SampleResult carries only the token), then row n is sampled.
void accept_synthetic(runner::Sampler& sampler, std::span<const float> rows, int32_t vocab,
                      std::span<const int32_t> prompt, std::span<const int32_t> output, std::span<const int32_t> drafts,
                      int32_t acceptance_length, Verified& result, std::vector<int32_t>& scratch);

// One position of general rejection sampling. p, q: probabilities [vocab] (q empty: point mass at
// `draft`). Accept when u_accept < min(1, p(d) / q(d)); else the token is the inverse CDF at
// u_residual of normalize(max(0, p - q)) (ascending ids). u in [0, 1). Throws core::Error on bad
// sizes, a draft outside the vocabulary, or q(d) = 0.
struct RejectionOutcome {
  bool accepted = false;
  int32_t token = -1;  // the draft when accepted, else the residual's sample
};
RejectionOutcome rejection_step(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                                double u_residual);

}  // namespace k3::spec
