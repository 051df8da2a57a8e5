// kernels/situ/situ_glu.h: SiTU-GLU (spec §8).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

struct SituGluArgs {
  core::TensorView gate;      // f32 [T, I]
  core::TensorView up;        // f32 [T, I]
  core::TensorView out;       // f32 [T, I]
  float beta = 4.0f;          // activation_situ_beta
  float linear_beta = 25.0f;  // activation_situ_linear_beta
  Precision precision = Precision::bf16;
};
core::Status situ_glu_check(const SituGluArgs& a);
// out = round( beta*tanh(a/beta)*sigmoid(a) * linear_beta*tanh(c/linear_beta) ), fp32 inside.
void situ_glu_reference(const SituGluArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
