// kernels/mla/cuda_cache.cu: CUDA MLA cache write (spec §6.3): T new entries [c_n | k_pe] into the
// pages, one block per token, all tokens of a step in one launch; token t goes to cache row
// cache_rows[t] (read on the device: the launch depends only on T), -1 skips it. bf16 and f32
// caches store the values (bf16 rounds to nearest even); f8_e4m3 caches store fp8(x / k_scale),
// round to nearest even, saturating at +-448 (NaN stays NaN). Also the cache gather between page
// layouts (mla_cache_gather: whole entries, bytes as they are).
#include <cuda_fp8.h>

#include "kernels/mla/cuda_mla_common.cuh"
#include "kernels/mla/ops.h"

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

// mla_cache_gather: one warp per dst row, moving the entry's bytes in Unit words (uint4 when every row
// start is 16-byte aligned, which K3's 576-wide caches are in every dtype); src_rows[i] < 0 skips row i.
constexpr int kGatherWarps = 8;
template <class Unit>
__global__ void cache_gather_kernel(const char* src, PagesRef sp, int64_t src_capacity, const int32_t* src_rows,
                                    char* dst, PagesRef dp, int64_t n, int64_t units) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kGatherWarps + threadIdx.x / 32;
  if (i >= n) return;
  const int64_t r = src_rows[i];
  if (r < 0 || r >= src_capacity) return;
  // PagesRef strides are in bytes here (the kernel sees the caches as bytes).
  const auto* from = reinterpret_cast<const Unit*>(src + (r / sp.block_size) * sp.page_ld +
                                                   (r % sp.block_size) * sp.row_ld);
  auto* to = reinterpret_cast<Unit*>(dst + (i / dp.block_size) * dp.page_ld + (i % dp.block_size) * dp.row_ld);
  for (int64_t u = threadIdx.x % 32; u < units; u += 32) to[u] = from[u];
}

// pages_ref in bytes instead of elements.
PagesRef byte_pages_ref(const core::TensorView& pages) {
  PagesRef p = pages_ref(pages);
  const auto es = static_cast<int64_t>(core::dtype_size(pages.dtype));
  p.page_ld *= es;
  p.row_ld *= es;
  return p;
}

}  // namespace

void register_mla_cache_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_cache_write.add(
      {"cuda_elementwise", core::Device::cuda,
       [ops](const MlaCacheWriteArgs& a) {
         if (auto s = ops.usable(); !s) return s;
         if (auto s = on_cuda({{"c_n", &a.c_n}, {"k_pe", &a.k_pe}, {"dst", &a.dst}, {"cache_rows", &a.cache_rows}}); !s)
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
           if (a.dst.dtype == core::DType::f8_e4m3) launch(a.dst.as<uint8_t>());
           else if (a.dst.dtype == core::DType::bf16) launch(a.dst.as<bf16>());
           else launch(a.dst.as<float>());
         });
       }});
  r.mla_cache_gather.add(
      {"cuda_warp_copy", core::Device::cuda,
       [ops](const MlaCacheGatherArgs& a) {
         if (auto s = ops.usable(); !s) return s;
         return on_cuda({{"src", &a.src}, {"src_rows", &a.src_rows}, {"dst", &a.dst}});
       },
       [ops](const MlaCacheGatherArgs& a) {
         const int64_t n = a.dst.dim(0) * a.dst.dim(1);
         if (n == 0) return;
         const PagesRef sp = byte_pages_ref(a.src), dp = byte_pages_ref(a.dst);
         const int64_t row_bytes = a.src.dim(2) * static_cast<int64_t>(core::dtype_size(a.src.dtype));
         // The widest word that divides every row start and the row length.
         const auto align = static_cast<uint64_t>(row_bytes | sp.page_ld | sp.row_ld | dp.page_ld | dp.row_ld) |
                            reinterpret_cast<uintptr_t>(a.src.data) | reinterpret_cast<uintptr_t>(a.dst.data);
         const auto grid = static_cast<unsigned>((n + kGatherWarps - 1) / kGatherWarps);
         const auto launch = [&](auto unit) {
           using Unit = decltype(unit);
           cache_gather_kernel<Unit><<<grid, kGatherWarps * 32, 0, ops.ctx->stream()>>>(
               a.src.as<const char>(), sp, a.src.dim(0) * a.src.dim(1), a.src_rows.as<const int32_t>(),
               a.dst.as<char>(), dp, n, row_bytes / static_cast<int64_t>(sizeof(Unit)));
           K3_CUDA_CHECK_LAUNCH("cache_gather_kernel");
         };
         if (align % 16 == 0) launch(uint4{});
         else if (align % 4 == 0) launch(uint32_t{});
         else launch(uint8_t{});
       }});
}

}  // namespace k3::kernels
