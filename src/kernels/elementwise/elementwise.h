// kernels/elementwise/elementwise.h: residual add and the sigmoid output gate (spec §3, §6.1).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// out = round(a + b): the residual prefix update P <- bf16(P + a) and the MoE tail sum.
struct AddArgs {
  core::TensorView a;    // f32 [T, D]
  core::TensorView b;    // f32 [T, D]
  core::TensorView out;  // f32 [T, D] (may alias a or b)
  Precision precision = Precision::bf16;
};
core::Status add_check(const AddArgs& a);
void add_reference(const AddArgs& a);

// MLA output gate: out = round(x * round(sigmoid(g))) (spec §6.1: the gate is stored as bf16).
struct SigmoidGateArgs {
  core::TensorView x;     // f32 [T, D] attention output (already rounded)
  core::TensorView gate;  // f32 [T, D] gate logits W_g x
  core::TensorView out;   // f32 [T, D] (may alias x)
  Precision precision = Precision::bf16;
};
core::Status sigmoid_gate_check(const SigmoidGateArgs& a);
void sigmoid_gate_reference(const SigmoidGateArgs& a);

}  // namespace k3::kernels
