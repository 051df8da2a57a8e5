// kernels/situ/situ_glu.h: the gated-linear-unit activations: SiTU-GLU (spec §8) and SiLU-GLU.
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

// SiLU-GLU, the Llama MLP activation (the EAGLE-3 draft's): out = round( silu(a) * c ) with
// silu(a) = a * sigmoid(a), fp32 inside and one rounding (vLLM's SiluAndMul; HF rounds silu(a)
// first in bf16).
struct SiluGluArgs {
  core::TensorView gate;  // f32 [T, I]
  core::TensorView up;    // f32 [T, I]
  core::TensorView out;   // f32 [T, I] (may alias gate or up)
  Precision precision = Precision::bf16;
};
core::Status silu_glu_check(const SiluGluArgs& a);
void silu_glu_reference(const SiluGluArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
