// kernels/mla/cuda_cache.cu: CUDA MLA cache write (spec §6.3): T new entries [c_n | k_pe] into the
// pages, one block per token, all tokens of a step in one launch; token t goes to cache row
// cache_rows[t] (read on the device: the launch depends only on T), -1 skips it. bf16 and f32
// caches store the values (bf16 rounds to nearest even); f8_e4m3 caches store fp8(x / k_scale),
// round to nearest even, saturating at +-448 (NaN stays NaN).
#include <cuda_fp8.h>

#include "kernels/mla/cuda_mla_common.cuh"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 128;

template <class T>
__device__ __forceinline__ void store_entry(T* dst, float v, float) {
  store_act(dst, v, false);
}
__device__ __forceinline__ void store_entry(uint8_t* dst, float v, float k_scale) {
  *dst = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / k_scale, __NV_SATFINITE, __NV_E4M3));
}

// Rows outside [0, capacity) (padding -1, or a bad table the host could not check) are skipped.
template <class In, class Out>
__global__ void cache_write_kernel(const In* c_n, int64_t c_ld, const In* k_pe, int64_t pe_ld,
                                   const int32_t* cache_rows, Out* pages, PagesRef pg, int64_t capacity,
                                   int64_t kv_lora, int64_t rope, float k_scale) {
  const int64_t t = blockIdx.x;
  const int64_t row = cache_rows[t];
  if (row < 0 || row >= capacity) return;
  Out* d = pages + (row / pg.block_size) * pg.page_ld + (row % pg.block_size) * pg.row_ld;
  for (int64_t i = threadIdx.x; i < kv_lora + rope; i += blockDim.x) {
    const float v = i < kv_lora ? to_f32(c_n[t * c_ld + i]) : to_f32(k_pe[t * pe_ld + (i - kv_lora)]);
    store_entry(d + i, v, k_scale);
  }
}

}  // namespace

void register_mla_cache_cuda(Registry& r, const CudaOps& ops) {
  r.mla_cache_write.add(
      {"cuda_elementwise", core::Device::cuda, 10,
       [ops](const MlaCacheWriteArgs& a) {
         if (auto s = ops.usable(); !s) return s;
         if (auto s = on_cuda({{"c_n", &a.c_n}, {"k_pe", &a.k_pe}, {"dst", &a.dst}, {"cache_rows", &a.cache_rows}});
             !s)
           return s;
         if (a.c_n.dtype != a.k_pe.dtype)
           return core::Status::fail("c_n and k_pe must share one dtype, got " + describe(a.c_n) + " and " +
                                     describe(a.k_pe));
         return core::Status::ok();
       },
       [ops](const MlaCacheWriteArgs& a) {
         const int64_t T = a.c_n.dim(0), L = a.c_n.dim(1), rope = a.k_pe.dim(1);
         if (T == 0) return;
         const int64_t capacity = a.dst.dim(0) * a.dst.dim(1);
         with_act(a.c_n.dtype, [&](auto it) {
           using In = typename decltype(it)::type;
           const auto launch = [&](auto* dst) {
             cache_write_kernel<<<static_cast<unsigned>(T), kThreads, 0, ops.ctx->stream()>>>(
                 a.c_n.as<const In>(), a.c_n.strides[0], a.k_pe.as<const In>(), a.k_pe.strides[0],
                 a.cache_rows.as<const int32_t>(), dst, pages_ref(a.dst), capacity, L, rope, a.k_scale);
             K3_CUDA_CHECK_LAUNCH("cache_write_kernel");
           };
           if (a.dst.dtype == core::DType::f8_e4m3)
             launch(a.dst.as<uint8_t>());
           else if (a.dst.dtype == core::DType::bf16)
             launch(a.dst.as<bf16>());
           else
             launch(a.dst.as<float>());
         });
       }});
}

}  // namespace k3::kernels
