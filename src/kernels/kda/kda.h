// kernels/kda/kda.h: Kimi Delta Attention ops (spec §5). One sequence per call.
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// Causal depthwise short conv + SiLU (spec §5.2), for one of q/k/v (or all three side by side).
// The fp32 sum runs i = 0..K-1; x before the sequence start is what the state holds (zeros for a
// new sequence). After T tokens the state holds the last K-1 inputs of (old state ++ x), also when
// T < K-1, so splitting a sequence over calls changes nothing. In bf16 mode the inputs are taken as
// round_act(x) (a no-op for the bf16 values upstream produces) and the state holds bf16 values.
// Activations may have a row stride (inner stride 1); out may alias x.
struct KdaConvArgs {
  core::TensorView x;       // f32 [T, C] pre-conv inputs (W_q x, W_k x or W_v x)
  core::TensorView weight;  // f32 [C, K] (or the checkpoint's [C, 1, K]); column K-1 multiplies the current token
  core::TensorView state;   // f32 [C, K-1] in/out: the last K-1 pre-conv inputs, oldest first
  core::TensorView out;     // f32 [T, C] = round(SiLU(sum_i w[c,i] x_{t-K+1+i}[c]))
  Precision precision = Precision::bf16;
};
core::Status kda_conv_check(const KdaConvArgs& a);
void kda_conv_reference(const KdaConvArgs& a);

// L2 norm of q,k (eps 1e-6 inside the sqrt of the sum), q scale head_dim^-1/2, beta = sigmoid(b),
// bounded decay g = lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)) (spec §5.3-5.4),
// then the delta rule over T tokens (spec §5.5 recurrent, §5.7 chunked; equal up to rounding).
// Both forms continue from `state` and leave the state after the last token in it, so prefill(T)
// then decode(k) equals one call over T+k. The state is always fp32 (also in bf16 mode); only the
// output o is rounded (round_act) in bf16 mode. Heads run in parallel, results do not depend on
// the thread count. Activations may have a row stride (inner stride 1); out may alias q, k, v or f.
// The chunked form accepts any positive chunk_size (the last chunk may be partial).
struct KdaAttentionArgs {
  core::TensorView q, k, v;  // f32 [T, H*D] post-conv (q~, k~, v~)
  core::TensorView f;        // f32 [T, H*D] decay logits (f_b output)
  core::TensorView b;        // f32 [T, H] beta logits
  core::TensorView a_log;    // f32 [>= H]; only the first H entries are used (spec §4 quirk)
  core::TensorView dt_bias;  // f32 [H*D]
  core::TensorView state;    // f32 [H, V=D, K=D] in/out, V-major: S[h][v][k]
  core::TensorView out;      // f32 [T, H*D] o (an activation: rounded in bf16 mode)
  int num_heads = 0, head_dim = 0;
  float lower_bound = -5.0f; // gate_lower_bound: g in (lower_bound, 0); must be negative
  int chunk_size = 64;       // kda_chunked only; any positive size
  Precision precision = Precision::bf16;
};
core::Status kda_attention_check(const KdaAttentionArgs& a);
void kda_recurrent_reference(const KdaAttentionArgs& a);
void kda_chunked_reference(const KdaAttentionArgs& a);

// Per-head RMSNorm (shared weight) times sigmoid of the full-rank gate (spec §5.6):
//   out = round( o_h * rsqrt(mean(o_h^2) + eps) * w * sigmoid(g^_h) ), fp32 inside, rounded once.
// out may alias o or gate.
struct KdaOutputGateArgs {
  core::TensorView o;       // f32 [T, H*D]
  core::TensorView gate;    // f32 [T, H*D] g^ = W_g x
  core::TensorView norm_w;  // f32/bf16 [D] o_norm.weight
  core::TensorView out;     // f32 [T, H*D] = round(rmsnorm(o_h) * w * sigmoid(g^_h)), fp32 inside
  int num_heads = 0, head_dim = 0;
  float eps = 1e-5f;
  Precision precision = Precision::bf16;
};
core::Status kda_output_gate_check(const KdaOutputGateArgs& a);
void kda_output_gate_reference(const KdaOutputGateArgs& a);

}  // namespace k3::kernels
