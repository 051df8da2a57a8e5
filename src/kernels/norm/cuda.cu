// kernels/norm/cuda.cu: CUDA RMSNorm (spec §2), one block per row, both styles:
//   inv_rms = 1 / sqrt(sum(x^2) / D + eps)        (fp32; block-wide sum)
//   moonshot: y = round(w * round(x * inv_rms))    fused: y = round(w * (x * inv_rms))
// Each thread reads and writes the same elements, after the reduction, so out may alias x.
#include "kernels/cuda_common.cuh"
#include "kernels/norm/ops.h"
#include "kernels/norm/rmsnorm.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;

// N elements per access: 8 (16-byte vectors) when rows and weight are aligned, else 1.
template <class T, int N>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const T* x, int64_t x_ld, const void* w, bool w_bf16, T* out, int64_t out_ld, int64_t D, float eps,
                   bool moonshot, bool round) {
  __shared__ float red[32];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * x_ld;
  T* yr = out + static_cast<int64_t>(blockIdx.x) * out_ld;
  float part = 0.0f;
  for (int64_t c = threadIdx.x * int64_t{N}; c < D; c += blockDim.x * int64_t{N}) {
    float v[N];
    load_act_n<N>(xr + c, v);
#pragma unroll
    for (int i = 0; i < N; ++i) part += v[i] * v[i];
  }
  const float sum_sq = block_sum(part, red);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(D) + eps);
  for (int64_t c = threadIdx.x * int64_t{N}; c < D; c += blockDim.x * int64_t{N}) {
    float v[N], wv[N];
    load_act_n<N>(xr + c, v);
    load_vec_n<N>(w, w_bf16, c, wv);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float x_hat = v[i] * inv_rms;
      if (moonshot) x_hat = round_if(x_hat, round);
      v[i] = wv[i] * x_hat;
    }
    store_act_n<N>(yr + c, v, round);
  }
}

}  // namespace

void register_rmsnorm_cuda(NormOps& r, const CudaOps& ops) {
  r.rmsnorm.add({"cuda_rowwise", core::Device::cuda,
                 [ops](const RmsNormArgs& a) {
                   return all_of({ops.usable(), on_cuda({{"x", &a.x}, {"w", &a.w}, {"out", &a.out}}),
                                  same_act({{"x", &a.x}, {"out", &a.out}}, a.precision)});
                 },
                 [ops](const RmsNormArgs& a) {
                   const int64_t T = a.x.dim(0), D = a.x.dim(1);
                   if (T == 0) return;
                   const bool vec = rows_vec8(a.x) && rows_vec8(a.out) && aligned16(a.w.data);
                   with_act(a.x.dtype, [&](auto tag) {
                     using E = typename decltype(tag)::type;
                     const auto launch = [&](auto kernel) {
                       kernel<<<static_cast<unsigned>(T), kThreads, 0, ops.ctx->stream()>>>(
                           a.x.as<const E>(), a.x.strides[0], a.w.data, a.w.dtype == core::DType::bf16, a.out.as<E>(),
                           a.out.strides[0], D, a.eps, a.style == RmsNormStyle::moonshot,
                           a.precision == Precision::bf16);
                       K3_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
                     };
                     if (vec) launch(rmsnorm_kernel<E, 8>);
                     else launch(rmsnorm_kernel<E, 1>);
                   });
                 }});
}

}  // namespace k3::kernels
