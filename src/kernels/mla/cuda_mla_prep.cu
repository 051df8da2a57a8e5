// kernels/mla/cuda_mla_prep.cu: CUDA mla_prep in one launch (design and byte counts: mla_prep.h): grid
// (T, 2), CTA (t, 0) = rmsnorm(q_a[t]) -> q_a_out[t], CTA (t, 1) = [rmsnorm(kv[t, :kv_lora]) ;
// kv[t, kv_lora:]] -> the page row cache_rows[t]. Each half is the CUDA rmsnorm kernel's math in its
// order (kernels/norm/cuda.cu: 256 threads, per-thread chains over a stride of 256 x N, block_sum),
// and the cache entry is stored as kernels/mla/cuda_cache.cu stores it.
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/mla/mla_prep.h"
#include "kernels/mla/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;  // the CUDA rmsnorm's block: the same sum order per row

struct PrepParams {
  const void* q_a = nullptr;  // [T, q_lora] activations, row t at q_a + t * q_a_ld
  int64_t q_a_ld = 0;
  const void* q_norm = nullptr;  // [q_lora] bf16 / f32
  bool q_norm_bf16 = false;
  void* q_out = nullptr;  // [T, q_lora] activations, row t at q_out + t * q_out_ld
  int64_t q_out_ld = 0;
  const void* kv = nullptr;  // [T, width] activations, row t at kv + t * kv_ld
  int64_t kv_ld = 0;
  const void* kv_norm = nullptr;  // [kv_lora] bf16 / f32
  bool kv_norm_bf16 = false;
  void* pages = nullptr;  // [num_blocks, block_size, width] cache elements
  int64_t page_ld = 0, row_ld = 0, block_size = 1;
  int64_t capacity = 0;                        // num_blocks * block_size: cache rows outside [0, capacity) are skipped
  const int32_t* cache_rows = nullptr;         // [T]
  int64_t q_lora = 0, kv_lora = 0, width = 0;  // width = kv_lora + rope
  float eps = 1e-6f, k_scale = 1.0f;
  bool moonshot = true;
  bool round = false;  // Precision::bf16: round every stored activation (bf16 storage always rounds)
};

// 1 / sqrt(sum(x^2) / D + eps) of row x [D], every thread of the block getting the same value: the
// CUDA rmsnorm kernel's chains (thread i: elements i*N.., stride kThreads * N) and block_sum's tree.
template <class E, int N>
__device__ __forceinline__ float row_inv_rms(const E* x, int64_t D, float eps, float* red) {
  float part = 0.0f;
  for (int64_t c = threadIdx.x * int64_t{N}; c < D; c += kThreads * int64_t{N}) {
    float v[N];
    load_act_n<N>(x + c, v);
#pragma unroll
    for (int i = 0; i < N; ++i) part += v[i] * v[i];
  }
  const float sum_sq = block_sum(part, red);
  return 1.0f / sqrtf(sum_sq / static_cast<float>(D) + eps);
}

// v = w * x_hat with x_hat = x * inv_rms (moonshot: rounded first), before the store's rounding.
template <int N>
__device__ __forceinline__ void normalise(float (&v)[N], const float (&w)[N], float inv_rms, bool moonshot,
                                          bool round) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float x_hat = v[i] * inv_rms;
    if (moonshot) x_hat = round_if(x_hat, round);
    v[i] = w[i] * x_hat;
  }
}

// N cache values at d (16-byte aligned chunk when N = 8): f32 pages keep v, bf16 pages round to nearest
// even, fp8 pages store fp8(v / k_scale) saturating at +-448 (NaN stays NaN), as cache_write_kernel.
template <int N>
__device__ __forceinline__ void store_entries(float* d, const float (&v)[N], float) {
  store_act_n<N>(d, v, false);
}
template <int N>
__device__ __forceinline__ void store_entries(bf16* d, const float (&v)[N], float) {
  store_act_n<N>(d, v, false);
}
__device__ __forceinline__ uint32_t fp8_code(float v, float k_scale) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v / k_scale, __NV_SATFINITE, __NV_E4M3));
}
template <int N>
__device__ __forceinline__ void store_entries(uint8_t* d, const float (&v)[N], float k_scale) {
  if constexpr (N == 8) {
    uint32_t lo = 0, hi = 0;  // little-endian: v[0] at the lowest address
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo |= fp8_code(v[i], k_scale) << (8 * i);
      hi |= fp8_code(v[4 + i], k_scale) << (8 * i);
    }
    *reinterpret_cast<uint2*>(d) = make_uint2(lo, hi);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) d[i] = static_cast<uint8_t>(fp8_code(v[i], k_scale));
  }
}

// Grid (T, 2), kThreads threads. E: activation type (bf16 / float), C: cache element (float / bf16 /
// uint8_t fp8 codes), N: elements per access (8: 16-byte vectors, host-checked alignment; 1: scalar).
// PDL: nothing is read or written before pdl_wait() (q_a and kv come from the kernel before; the cache
// rows are step tables); the norm weights are read after it too (tiny, from L2).
template <class E, class C, int N>
__global__ void __launch_bounds__(kThreads) mla_prep_kernel(PrepParams p) {
  __shared__ float red[32];
  pdl_launch_dependents();  // q_b's projection may start its weight prefetch; it waits for this grid
  pdl_wait();
  const int64_t t = blockIdx.x;
  if (blockIdx.y == 0) {
    const E* __restrict__ x = static_cast<const E*>(p.q_a) + t * p.q_a_ld;
    E* __restrict__ y = static_cast<E*>(p.q_out) + t * p.q_out_ld;  // never overlaps q_a (host-checked)
    const float inv_rms = row_inv_rms<E, N>(x, p.q_lora, p.eps, red);
    for (int64_t c = threadIdx.x * int64_t{N}; c < p.q_lora; c += kThreads * int64_t{N}) {
      float v[N], w[N];
      load_act_n<N>(x + c, v);
      load_vec_n<N>(p.q_norm, p.q_norm_bf16, c, w);
      normalise<N>(v, w, inv_rms, p.moonshot, p.round);
      store_act_n<N>(y + c, v, p.round);
    }
    return;
  }
  const int64_t row = p.cache_rows[t];
  if (row < 0 || row >= p.capacity) return;  // -1 (no write) or a bad row: the whole block, before any barrier
  const E* x = static_cast<const E*>(p.kv) + t * p.kv_ld;
  C* d = static_cast<C*>(p.pages) + (row / p.block_size) * p.page_ld + (row % p.block_size) * p.row_ld;
  const float inv_rms = row_inv_rms<E, N>(x, p.kv_lora, p.eps, red);
  // Columns [0, kv_lora) are c_n, [kv_lora, width) k_pe; N divides kv_lora, so no vector straddles them.
  for (int64_t c = threadIdx.x * int64_t{N}; c < p.width; c += kThreads * int64_t{N}) {
    float v[N];
    load_act_n<N>(x + c, v);
    if (c < p.kv_lora) {
      float w[N];
      load_vec_n<N>(p.kv_norm, p.kv_norm_bf16, c, w);
      normalise<N>(v, w, inv_rms, p.moonshot, p.round);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = round_if(v[i], p.round);  // c_n as the standard path stores it
    }
    store_entries<N>(d + c, v, p.k_scale);
  }
}

// Whether a page row of `pages` starts 16-byte aligned wherever it is (pages and row pitches).
bool pages_vec8(const core::TensorView& pages) {
  const auto esize = static_cast<int64_t>(core::dtype_size(pages.dtype));
  return aligned16(pages.data) && (pages.strides[0] * esize) % 16 == 0 && (pages.strides[1] * esize) % 16 == 0;
}

}  // namespace

void register_mla_prep_cuda(MlaOps& r, const CudaOps& ops) {
  r.mla_prep.add({"cuda_rowwise", core::Device::cuda,
                  [ops](const MlaPrepArgs& a) {
                    return all_of({ops.usable(),
                                   on_cuda({{"q_a", &a.q_a},
                                            {"q_a_norm", &a.q_a_norm},
                                            {"q_a_out", &a.q_a_out},
                                            {"kv", &a.kv},
                                            {"kv_a_norm", &a.kv_a_norm},
                                            {"pages", &a.pages},
                                            {"cache_rows", &a.cache_rows}}),
                                   same_act({{"q_a", &a.q_a}, {"q_a_out", &a.q_a_out}, {"kv", &a.kv}}, a.precision)});
                  },
                  [ops](const MlaPrepArgs& a) {
                    const int64_t T = a.q_a.dim(0);
                    if (T == 0) return;
                    PrepParams p;
                    p.q_a = a.q_a.data;
                    p.q_a_ld = a.q_a.strides[0];
                    p.q_norm = a.q_a_norm.data;
                    p.q_norm_bf16 = a.q_a_norm.dtype == core::DType::bf16;
                    p.q_out = a.q_a_out.data;
                    p.q_out_ld = a.q_a_out.strides[0];
                    p.kv = a.kv.data;
                    p.kv_ld = a.kv.strides[0];
                    p.kv_norm = a.kv_a_norm.data;
                    p.kv_norm_bf16 = a.kv_a_norm.dtype == core::DType::bf16;
                    p.pages = a.pages.data;
                    p.page_ld = a.pages.strides[0];
                    p.row_ld = a.pages.strides[1];
                    p.block_size = a.pages.dim(1);
                    p.capacity = a.pages.dim(0) * a.pages.dim(1);
                    p.cache_rows = a.cache_rows.as<const int32_t>();
                    p.q_lora = a.q_a.dim(1);
                    p.kv_lora = a.kv_a_norm.dim(0);
                    p.width = a.kv.dim(1);
                    p.eps = a.eps;
                    p.k_scale = a.k_scale;
                    p.moonshot = a.style == RmsNormStyle::moonshot;
                    p.round = a.precision == Precision::bf16;
                    // One vector width for both halves: every row, weight and page row aligned, every width a multiple
                    // of 8 (rows_vec8 checks q_lora and kv_lora + rope; kv_lora too, so that rope is one as well).
                    const bool vec = rows_vec8(a.q_a) && rows_vec8(a.q_a_out) && aligned16(a.q_a_norm.data) &&
                                     rows_vec8(a.kv) && p.kv_lora % 8 == 0 && aligned16(a.kv_a_norm.data) &&
                                     pages_vec8(a.pages);
                    const dim3 grid(static_cast<unsigned>(T), 2), block(kThreads), no_cluster(1, 1, 1);
                    const cudaStream_t stream = ops.ctx->stream();
                    with_act(a.q_a.dtype, [&](auto tag) {
                      using E = typename decltype(tag)::type;
                      const auto launch = [&](auto cache_tag) {
                        using C = typename decltype(cache_tag)::type;
                        if (vec) launch_dependent(mla_prep_kernel<E, C, 8>, grid, block, 0, stream, no_cluster, p);
                        else launch_dependent(mla_prep_kernel<E, C, 1>, grid, block, 0, stream, no_cluster, p);
                      };
                      if (a.pages.dtype == core::DType::f8_e4m3) launch(Tag<uint8_t>{});
                      else if (a.pages.dtype == core::DType::bf16) launch(Tag<bf16>{});
                      else launch(Tag<float>{});
                    });
                  }});
}

}  // namespace k3::kernels
