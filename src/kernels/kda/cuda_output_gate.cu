// kernels/kda/cuda_output_gate.cu: CUDA KDA output norm and gate (spec §5.6), one warp per (token,
// head), the heads of a token in parallel:
//   rstd = 1/sqrt(sum(o^2)/D + eps); out = round(((o * rstd) * w) * sigmoid(gate)), fp32 inside,
// rounded once. Each lane reads then writes its own elements: out may alias o or gate.
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/kda/kda.h"
#include "kernels/kda/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kMaxWarps = 16;  // heads of a token in parallel (one warp each; more heads loop)

// N elements per access: 8 (16-byte vectors) when rows and weight are aligned, else 1.
template <class T, int N>
__global__ void __launch_bounds__(kMaxWarps * 32)
    output_gate_kernel(const T* o, int64_t o_ld, const T* gate, int64_t gate_ld, const void* w, bool w_bf16, T* out,
                       int64_t out_ld, int H, int D, float eps, bool round) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int h = warp; h < H; h += warps) {
    const int64_t c0 = static_cast<int64_t>(h) * D;
    const T* oh = o + t * o_ld + c0;
    float part = 0.0f;
    for (int i = lane * N; i < D; i += 32 * N) {
      float v[N];
      load_act_n<N>(oh + i, v);
#pragma unroll
      for (int e = 0; e < N; ++e) part += v[e] * v[e];
    }
    const float rstd = 1.0f / sqrtf(warp_sum(part) / static_cast<float>(D) + eps);
    const T* gh = gate + t * gate_ld + c0;
    T* yh = out + t * out_ld + c0;
    for (int i = lane * N; i < D; i += 32 * N) {
      float v[N], g[N], wv[N];
      load_act_n<N>(oh + i, v);
      load_act_n<N>(gh + i, g);
      load_vec_n<N>(w, w_bf16, i, wv);
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] = v[e] * rstd * wv[e] * sigmoid_f32(g[e]);
      store_act_n<N>(yh + i, v, round);
    }
  }
}

}  // namespace

void register_kda_output_gate_cuda(KdaOps& r, const CudaOps& ops) {
  r.kda_output_gate.add(
      {"cuda_warp_per_head", core::Device::cuda,
       [ops](const KdaOutputGateArgs& a) {
         return all_of({ops.usable(), on_cuda({{"o", &a.o}, {"gate", &a.gate}, {"norm_w", &a.norm_w}, {"out", &a.out}}),
                        same_act({{"o", &a.o}, {"gate", &a.gate}, {"out", &a.out}}, a.precision)});
       },
       [ops](const KdaOutputGateArgs& a) {
         const int64_t T = a.o.dim(0);
         if (T == 0) return;
         const bool vec = a.head_dim % 8 == 0 && rows_vec8(a.o) && rows_vec8(a.gate) && rows_vec8(a.out) &&
                          aligned16(a.norm_w.data);
         const int threads = 32 * std::min(a.num_heads, kMaxWarps);
         with_act(a.o.dtype, [&](auto tag) {
           using E = typename decltype(tag)::type;
           const auto launch = [&](auto kernel) {
             kernel<<<static_cast<unsigned>(T), threads, 0, ops.ctx->stream()>>>(
                 a.o.as<const E>(), a.o.strides[0], a.gate.as<const E>(), a.gate.strides[0], a.norm_w.data,
                 a.norm_w.dtype == core::DType::bf16, a.out.as<E>(), a.out.strides[0], a.num_heads, a.head_dim, a.eps,
                 a.precision == Precision::bf16);
             K3_CUDA_CHECK_LAUNCH("output_gate_kernel");
           };
           if (vec) launch(output_gate_kernel<E, 8>);
           else launch(output_gate_kernel<E, 1>);
         });
       }});
}

}  // namespace k3::kernels
