// kernels/kda/gate.h: internal to kernels/kda: the per-token front shared by both KDA attention
// forms (spec §5.3-5.4: L2 norm and scale of q,k, beta, bounded decay) and small fp32 helpers.
//
// The recurrent (§5.5) and chunked (§5.7) forms both call kda_prepare_token, so they see the very
// same q, k, v, beta and g bits; they differ only in how the delta rule is evaluated.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "kernels/kda/kda.h"

namespace k3::kernels::kda_detail {

// Epsilon inside the sqrt of the SUM of squares of the q/k L2 norm (spec §5.3).
inline constexpr float kL2NormEps = 1e-6f;

// libm expf in fp32 (spec §2). sigmoid(x) = 1 / (1 + e^-x): saturates to exactly 0 or 1.
inline float sigmoid_f32(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// SiLU(x) = x / (1 + e^-x) (the PyTorch form; x * sigmoid(x) can differ by one rounding).
inline float silu_f32(float x) { return x / (1.0f + std::exp(-x)); }

// Bounded log-decay of one channel (spec §5.4):
//   g = lower_bound * sigmoid(exp(a_log) * (f + dt_bias)), in (lower_bound, 0) for moderate inputs;
// saturation of the sigmoid can reach exactly lower_bound or -0, never beyond.
inline float kda_gate(float f, float dt_bias, float a_log, float lower_bound) {
  const float z = f + dt_bias;
  return lower_bound * sigmoid_f32(std::exp(a_log) * z);
}

// Row t of an activation [T, X] whose inner stride is 1 (checked by the *_check functions).
inline const float* row_f32(const core::TensorView& v, int64_t t) { return v.as<const float>() + t * v.strides[0]; }
inline float* row_f32_mut(const core::TensorView& v, int64_t t) { return v.as<float>() + t * v.strides[0]; }

// One token of one head, prepared for the delta rule (all fp32, D = head_dim entries each):
//   q = q~ / sqrt(sum q~^2 + 1e-6) * D^-1/2,  k = k~ / sqrt(sum k~^2 + 1e-6),  v = v~,
//   g[i] = kda_gate(f[h,i], dt_bias[h,i], A_log[h], lower_bound),  *beta = sigmoid(b[h]).
void kda_prepare_token(const KdaAttentionArgs& a, int64_t t, int h, float* q, float* k, float* v, float* g,
                       float* beta);

// Returns out[i] = x[i] / sqrt(sum x^2 + 1e-6) * scale over n entries (sum sequential in fp32).
void kda_l2_normalize(const float* x, int n, float scale, float* out);

}  // namespace k3::kernels::kda_detail
