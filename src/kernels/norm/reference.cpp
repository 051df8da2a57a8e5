// kernels/norm/reference.cpp: CPU reference RMSNorm, Moonshot (double rounding) and fused styles.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {

namespace {
std::string describe(const core::TensorView& v) { return std::string(core::dtype_name(v.dtype)) + " " + v.shape.str(); }
}  // namespace

core::Status rmsnorm_check(const RmsNormArgs& a) {
  if (!is_activation_dtype(a.x) || a.x.rank() != 2 || a.x.strides[1] != 1)
    return core::Status::fail("x must be f32 (or bf16 on CUDA) [T, D] with contiguous rows, got " + describe(a.x));
  const int64_t T = a.x.dim(0), D = a.x.dim(1);
  if ((a.w.dtype != core::DType::bf16 && a.w.dtype != core::DType::f32) || a.w.rank() != 1 || a.w.dim(0) != D ||
      !a.w.is_contiguous())
    return core::Status::fail("w must be bf16 or f32 [" + std::to_string(D) + "], got " + describe(a.w));
  if (!is_activation_dtype(a.out) || a.out.rank() != 2 || a.out.strides[1] != 1 || a.out.dim(0) != T ||
      a.out.dim(1) != D)
    return core::Status::fail("out must be f32 (or bf16 on CUDA) [" + std::to_string(T) + ", " + std::to_string(D) +
                              "], got " + describe(a.out));
  if (!(a.eps >= 0.0f)) return core::Status::fail("eps must be >= 0, got " + std::to_string(a.eps));
  return core::Status::ok();
}

void rmsnorm_reference(const RmsNormArgs& a, backends::cpu::ThreadPool* pool) {
  const int64_t T = a.x.dim(0), D = a.x.dim(1);
  // The weight is decoded once per call; per-token work then reads plain floats.
  std::vector<float> w(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) w[i] = load_f32(a.w, i);
  const bool moonshot = a.style == RmsNormStyle::moonshot;
  backends::cpu::parallel_for(
      pool, T,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const float* x = a.x.as<const float>() + t * a.x.strides[0];
          float* y = a.out.as<float>() + t * a.out.strides[0];  // may alias x: x is read first
          float sum_sq = 0.0f;                                  // fp32, sequential over D
          for (int64_t i = 0; i < D; ++i) sum_sq += x[i] * x[i];
          const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(D) + a.eps);
          // Both styles compute w * (x * inv_rms); they differ only in whether x * inv_rms
          // is stored (rounded) first, so in fp32 mode they are the same function.
          for (int64_t i = 0; i < D; ++i) {
            float x_hat = x[i] * inv_rms;
            if (moonshot) x_hat = round_act(x_hat, a.precision);
            y[i] = round_act(w[i] * x_hat, a.precision);
          }
        }
      },
      /*min_per_task=*/std::max<int64_t>(1, 8192 / std::max<int64_t>(1, D)));
}

}  // namespace k3::kernels
