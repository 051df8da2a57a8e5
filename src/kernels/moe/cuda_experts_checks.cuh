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

// Persistent blocks of `threads` threads: as many as fit on the device at once (cached per device,
// kernel and shared memory: the shared-memory opt-in and the occupancy are properties of the
// function on one device, and TP ranks launch the same kernels on several GPUs), never more than
// the items.
template <class Kernel>
unsigned persistent_blocks(Kernel kernel, int threads, size_t smem, int sm_count, int64_t items) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, size_t>, int> per_sm;
  int device = 0;
  K3_CUDA_CHECK(cudaGetDevice(&device));
  int n = 0;
  {
    std::lock_guard<std::mutex> lk(mu);
    const auto key = std::tuple{device, reinterpret_cast<const void*>(kernel), smem};
    auto it = per_sm.find(key);
    if (it == per_sm.end()) {
      allow_smem(kernel, smem);
      K3_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
      it = per_sm.emplace(key, std::max(n, 1)).first;
    }
    n = it->second;
  }
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(items, int64_t{n} * sm_count)));
}

}  // namespace k3::kernels::cuda_detail
