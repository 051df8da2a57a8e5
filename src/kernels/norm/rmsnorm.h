// kernels/norm/rmsnorm.h: RMSNorm over the last dimension (spec §2).
#pragma once
#include "core/error.h"
#include "kernels/common.h"

namespace k3::kernels {

// moonshot: x_hat = round(x * rsqrt(mean(x^2) + eps)), y = round(w * x_hat)  (double rounding)
// fused:    y = round(w * x * rsqrt(mean(x^2) + eps))                       (single rounding)
// Both evaluate w * (x * inv_rms) in that order, so in fp32 mode the two are the same
// function bit for bit; in bf16 mode they differ by at most 1 bf16 ulp.
enum class RmsNormStyle : uint8_t { moonshot, fused };

struct RmsNormArgs {
  core::TensorView x;    // f32 [T, D]
  core::TensorView w;    // bf16 or f32 [D]
  core::TensorView out;  // f32 [T, D] (may alias x)
  float eps = 1e-5f;
  RmsNormStyle style = RmsNormStyle::moonshot;
  Precision precision = Precision::bf16;
};
core::Status rmsnorm_check(const RmsNormArgs& a);
void rmsnorm_reference(const RmsNormArgs& a, backends::cpu::ThreadPool* pool = nullptr);

}  // namespace k3::kernels
