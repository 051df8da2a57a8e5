// kernels/moe/cuda_experts_checks.cuh: the checks every CUDA strategy of moe_experts starts with
// (cuda_experts.cu's rowdot/mma kernels, cuda_experts_gemv.cu, cuda_experts_grouped.cu): a usable
// device, every tensor on it, and the activation dtypes; without round_output (a TP rank's partial
// sum) out must be f32. Also the grid size of the persistent-block kernels.
#pragma once
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda_common.cuh"
#include "kernels/moe/experts.h"
#include "kernels/op_table.h"

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

// Persistent blocks of `threads` threads: as many as fit on the device at once (the context
// remembers the occupancy per kernel and shared memory), never more than the items.
template <class Kernel>
unsigned persistent_blocks(const CudaOps& ops, Kernel kernel, int threads, size_t smem, int64_t items) {
  const int n = ops.ctx->blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, int64_t{n} * ops.ctx->info().sm_count)));
}

}  // namespace k3::kernels::cuda_detail
