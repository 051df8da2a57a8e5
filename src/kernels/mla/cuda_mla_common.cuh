// kernels/mla/cuda_mla_common.cuh: internal to kernels/mla: what the CUDA naive and absorbed MLA
// forms share: reading a cache element (f32, bf16, or fp8 e4m3 times k_scale) and supports().
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/mla/mla.h"

namespace k3::kernels::cuda_detail {

// Cache element i of row j (the cache is [S, kv_lora + rope], row stride ld) as f32.
__device__ __forceinline__ float cache_value(const float* c, int64_t ld, int64_t j, int64_t i, float) {
  return c[j * ld + i];
}
__device__ __forceinline__ float cache_value(const bf16* c, int64_t ld, int64_t j, int64_t i, float) {
  return __bfloat162float(c[j * ld + i]);
}
__device__ __forceinline__ float cache_value(const uint8_t* c, int64_t ld, int64_t j, int64_t i, float k_scale) {
  const __half h = __nv_cvt_fp8_to_halfraw(c[j * ld + i], __NV_E4M3);
  return __half2float(h) * k_scale;  // fp8(code) * k_scale, as the reference's table
}

// Calls fn(const CacheT*) with the cache's element type.
template <class Fn>
void with_cache(const core::TensorView& cache, Fn&& fn) {
  if (cache.dtype == core::DType::f8_e4m3)
    fn(cache.as<const uint8_t>());
  else if (cache.dtype == core::DType::bf16)
    fn(cache.as<const bf16>());
  else
    fn(cache.as<const float>());
}

// Dynamic shared vectors are padded to whole 16-byte groups (zeros past the end): the compiler may
// read an unrolled loop's tail with one vector load (seen as out-of-bounds reads by memcheck).
__host__ __device__ constexpr int padded_floats(int n) { return (n + 3) / 4 * 4; }

constexpr int kMlaMaxLatent = 512;  // kv_lora limit of the absorbed kernels (K3: 512)
constexpr int kMlaMaxV = 256;       // v_head_dim limit of the naive kernel (K3: 128)

inline core::Status mla_supports(const CudaOps& ops, const MlaAttentionArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"q", &a.q}, {"cache", &a.cache}, {"out", &a.out}}); !s) return s;
  if (auto s = weight_on_cuda(*a.kv_b, "kv_b"); !s) return s;
  if (auto s = same_act({{"q", &a.q}, {"out", &a.out}}, a.precision); !s) return s;
  if (overlaps(a.out, a.q)) return core::Status::fail("out must not alias q on CUDA");
  return core::Status::ok();
}

}  // namespace k3::kernels::cuda_detail
