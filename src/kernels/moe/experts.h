// kernels/moe/experts.h: routed experts in latent space (spec §7): u = round(sum_j p_j e_j).
#pragma once
#include <span>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct MoeExpertsArgs {
  core::TensorView z;                // f32 [T, L] latent input (W_down x)
  core::TensorView ids;              // i32 [T, k]
  core::TensorView weights;          // f32 [T, k]
  std::span<const LinearWeight> w1;  // per expert: gate [I, L]
  std::span<const LinearWeight> w3;  // per expert: up   [I, L]
  std::span<const LinearWeight> w2;  // per expert: down [L, I]
  core::TensorView out;              // f32 [T, L] (rows may be strided)
  float beta = 4.0f, linear_beta = 25.0f;
  Precision precision = Precision::bf16;
  // false: a tensor-parallel rank's partial sum (spec §11; its w2 hold a slice of every expert's
  // intermediate): e_j and out stay unrounded fp32 (out must be f32 on every device), so that the
  // sum over the ranks is rounded once, after the all-reduce. The gate/up outputs and SiTU are
  // rounded as ever (they are whole values of the rank's intermediate channels).
  bool round_output = true;
  // Expert parallelism (spec §11 "EP variant"; the all-reduce form: every rank holds the whole
  // batch, as under TP, and contributes its partial sum to the same latent all-reduce): w1/w3/w2
  // hold the whole experts [expert_begin, expert_begin + w1.size()) of num_experts in all
  // (num_experts = 0 means w1.size(): every expert, expert_begin 0). ids stay global: a route
  // whose id is in [0, num_experts) but outside the held range contributes nothing (it is skipped:
  // no weight is read, nothing is added); an id outside [0, num_experts) is a bad id as ever.
  int64_t expert_begin = 0;
  int64_t num_experts = 0;
  // With round_output off: true when w1/w3/w2 are whole experts (an expert-parallel rank), so each
  // e_j is a whole expert's output and is rounded exactly as at TP=1; only the sum over the held
  // routes stays an unrounded f32 partial until after the all-reduce. false (a TP-sharded rank,
  // whose w2 hold a slice of every expert's intermediate): e_j is a partial too and stays
  // unrounded. Ignored with round_output on (e_j is rounded then).
  bool whole_experts = false;
};
// The number of experts ids index (num_experts, or w1.size() when 0).
inline int64_t moe_total_experts(const MoeExpertsArgs& a) {
  return a.num_experts > 0 ? a.num_experts : static_cast<int64_t>(a.w1.size());
}
// Whether each e_j is rounded (in Precision::bf16): a whole expert's output (see whole_experts).
inline bool moe_rounds_expert_outputs(const MoeExpertsArgs& a) { return a.round_output || a.whole_experts; }
core::Status moe_experts_check(const MoeExpertsArgs& a);
// e_j = round(W2_j · SiTU(W1_j z, W3_j z)) with linear rounding as in linear_reference;
// out = round(sum_j p_j * e_j) accumulated in fp32 in route order (out may alias z); without
// round_output neither round() is applied (e_j still rounded with whole_experts). The sum runs
// over the held routes only (expert parallelism), still in route order; a token none of whose
// routes is held gets exactly 0.
// The check also verifies the held range lies in [0, num_experts) and, for ids on the CPU, that
// every id is in [0, num_experts).
void moe_experts_reference(const MoeExpertsArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
