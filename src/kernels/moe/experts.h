// kernels/moe/experts.h: routed experts in latent space (spec §7): u = round(sum_j p_j e_j).
#pragma once
#include <span>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct MoeExpertsArgs {
  core::TensorView z;                   // f32 [T, L] latent input (W_down x)
  core::TensorView ids;                 // i32 [T, k]
  core::TensorView weights;             // f32 [T, k]
  std::span<const LinearWeight> w1;     // per expert: gate [I, L]
  std::span<const LinearWeight> w3;     // per expert: up   [I, L]
  std::span<const LinearWeight> w2;     // per expert: down [L, I]
  core::TensorView out;                 // f32 [T, L] (rows may be strided)
  float beta = 4.0f, linear_beta = 25.0f;
  Precision precision = Precision::bf16;
  // false: a tensor-parallel rank's partial sum (spec §11; its w2 hold a slice of every expert's
  // intermediate): e_j and out stay unrounded fp32 (out must be f32 on every device), so that the
  // sum over the ranks is rounded once, after the all-reduce. The gate/up outputs and SiTU are
  // rounded as ever (they are whole values of the rank's intermediate channels).
  bool round_output = true;
};
core::Status moe_experts_check(const MoeExpertsArgs& a);
// e_j = round(W2_j · SiTU(W1_j z, W3_j z)) with linear rounding as in linear_reference;
// out = round(sum_j p_j * e_j) accumulated in fp32 in route order (out may alias z); without
// round_output neither round() is applied.
// The check also verifies every id is in [0, number of experts).
void moe_experts_reference(const MoeExpertsArgs& a);

}  // namespace k3::kernels
