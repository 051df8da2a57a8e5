// kernels/moe/router.h: sigmoid router with selection bias and top-k (spec §7).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct RouterTopkArgs {
  core::TensorView logits;   // f32 [T, E] (fp32 router GEMM output)
  core::TensorView bias;     // f32 [E] e_score_correction_bias (bf16-rounded in bf16 mode by the loader)
  core::TensorView ids;      // i32 [T, k] out, in descending biased-score order
  core::TensorView weights;  // f32 [T, k] out: s_j / (sum s + 1e-20) * scaling (bias NOT included)
  bool renormalize = true;
  float scaling = 1.0f;
};
core::Status router_topk_check(const RouterTopkArgs& a);
// Ties: higher biased score wins; on exact ties the lower expert id wins. The renormalising
// sum runs over the selected s in written order. A NaN biased score throws core::Error.
void router_topk_reference(const RouterTopkArgs& a);

}  // namespace k3::kernels
