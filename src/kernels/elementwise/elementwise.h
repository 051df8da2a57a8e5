// kernels/elementwise/elementwise.h: residual add and the sigmoid output gate (spec §3, §6.1), and
// the rounding of an fp32 sum into an activation (tensor parallelism, spec §11).
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

// out = round(x): an fp32 sum stored as an activation. Under tensor parallelism (spec §11) a
// row-parallel layer (o_proj, down_proj, the MoE latent and shared partial sums) gives each rank an
// unrounded fp32 partial product; after the all-reduce the sum is rounded here, once, as TP=1
// rounds the unsplit linear output once.
struct ToActivationArgs {
  core::TensorView x;    // f32 [T, D]; rows may be strided (unit inner stride)
  core::TensorView out;  // f32 [T, D] (or bf16 on CUDA); rows may be strided; may be x itself
  Precision precision = Precision::bf16;
};
core::Status to_activation_check(const ToActivationArgs& a);
void to_activation_reference(const ToActivationArgs& a);

}  // namespace k3::kernels
