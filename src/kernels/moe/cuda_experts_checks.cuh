// kernels/moe/cuda_experts_checks.cuh: the checks every CUDA strategy of moe_experts starts with
// (cuda_experts.cu's rowdot/mma kernels and cuda_experts_gemv.cu): a usable device, every tensor on
// it, and the activation dtypes; without round_output (a TP rank's partial sum) out must be f32.
#pragma once
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_ops.h"
#include "kernels/moe/experts.h"

namespace k3::kernels::cuda_detail {

inline core::Status experts_io_supports(const CudaOps& ops, const MoeExpertsArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"z", &a.z}, {"ids", &a.ids}, {"weights", &a.weights}, {"out", &a.out}}); !s) return s;
  if (a.round_output) return same_act({{"z", &a.z}, {"out", &a.out}}, a.precision);
  if (auto s = same_act({{"z", &a.z}}, a.precision); !s) return s;
  if (a.out.dtype != core::DType::f32)
    return core::Status::fail("out must be f32 when round_output is off (unrounded partial sums), got " +
                              describe(a.out));
  return core::Status::ok();
}

}  // namespace k3::kernels::cuda_detail
