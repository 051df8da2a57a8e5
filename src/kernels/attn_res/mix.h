// kernels/attn_res/mix.h: the AttnRes depth-attention Mix (spec §3.1).
#pragma once
#include <span>

#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct AttnResMixArgs {
  std::span<const core::TensorView> sources;  // n views, each f32 [T, D]: bank rows, then prefix
  core::TensorView query;                     // bf16/f32 [D] (res_proj.weight, stored [1, D])
  core::TensorView norm;                      // bf16/f32 [D] (res_norm.weight)
  core::TensorView out;                       // f32 [T, D]
  float eps = 1e-5f;
  Precision precision = Precision::bf16;
};
core::Status attn_res_mix_check(const AttnResMixArgs& a);
// rho_j = rsqrt(mean(R_j^2)+eps); s_j = rho_j * sum(R_j * c), c = norm*query in fp32;
// alpha = softmax(s); out = round(sum_j alpha_j R_j)  (un-normalised sources, index order).
// One source gives out = R_0 exactly. out may alias any source.
void attn_res_mix_reference(const AttnResMixArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
