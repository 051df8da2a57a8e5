// kernels/situ/cuda.cu: CUDA SiTU-GLU (spec §8) and SiLU-GLU, one thread per element, rows may be strided:
//   out = round( [beta*tanh(a/beta)*sigmoid(a)] * [linear_beta*tanh(c/linear_beta)] ), fp32 inside.
#include "kernels/cuda_common.cuh"
#include "kernels/situ/ops.h"
#include "kernels/situ/situ_glu.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void situ_kernel(const T* gate, int64_t gate_ld, const T* up, int64_t up_ld, T* out, int64_t out_ld,
                            int64_t T_rows, int64_t I, float beta, float linear_beta, bool round) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T_rows * I) return;
  const int64_t t = idx / I, i = idx % I;
  const float g = to_f32(gate[t * gate_ld + i]), c = to_f32(up[t * up_ld + i]);
  const float gate_act = beta * tanhf(g / beta) * sigmoid_f32(g);
  const float up_act = linear_beta * tanhf(c / linear_beta);
  store_act(out + t * out_ld + i, gate_act * up_act, round);
}

template <class T>
__global__ void silu_kernel(const T* gate, int64_t gate_ld, const T* up, int64_t up_ld, T* out, int64_t out_ld,
                            int64_t T_rows, int64_t I, bool round) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T_rows * I) return;
  const int64_t t = idx / I, i = idx % I;
  const float g = to_f32(gate[t * gate_ld + i]), c = to_f32(up[t * up_ld + i]);
  store_act(out + t * out_ld + i, g * sigmoid_f32(g) * c, round);
}

}  // namespace

void register_situ_cuda(SituOps& r, const CudaOps& ops) {
  r.situ_glu.add({"cuda_elementwise", core::Device::cuda,
                  [ops](const SituGluArgs& a) {
                    return all_of({ops.usable(), on_cuda({{"gate", &a.gate}, {"up", &a.up}, {"out", &a.out}}),
                                   same_act({{"gate", &a.gate}, {"up", &a.up}, {"out", &a.out}}, a.precision)});
                  },
                  [ops](const SituGluArgs& a) {
                    const int64_t T = a.gate.dim(0), I = a.gate.dim(1);
                    if (T * I == 0) return;
                    with_act(a.out.dtype, [&](auto tag) {
                      using E = typename decltype(tag)::type;
                      situ_kernel<E><<<grid_for(T * I, kThreads), kThreads, 0, ops.ctx->stream()>>>(
                          a.gate.as<const E>(), a.gate.strides[0], a.up.as<const E>(), a.up.strides[0], a.out.as<E>(),
                          a.out.strides[0], T, I, a.beta, a.linear_beta, a.precision == Precision::bf16);
                      K3_CUDA_CHECK_LAUNCH("situ_kernel");
                    });
                  }});
  r.silu_glu.add({"cuda_elementwise", core::Device::cuda,
                  [ops](const SiluGluArgs& a) {
                    return all_of({ops.usable(), on_cuda({{"gate", &a.gate}, {"up", &a.up}, {"out", &a.out}}),
                                   same_act({{"gate", &a.gate}, {"up", &a.up}, {"out", &a.out}}, a.precision)});
                  },
                  [ops](const SiluGluArgs& a) {
                    const int64_t T = a.gate.dim(0), I = a.gate.dim(1);
                    if (T * I == 0) return;
                    with_act(a.out.dtype, [&](auto tag) {
                      using E = typename decltype(tag)::type;
                      silu_kernel<E><<<grid_for(T * I, kThreads), kThreads, 0, ops.ctx->stream()>>>(
                          a.gate.as<const E>(), a.gate.strides[0], a.up.as<const E>(), a.up.strides[0], a.out.as<E>(),
                          a.out.strides[0], T, I, a.precision == Precision::bf16);
                      K3_CUDA_CHECK_LAUNCH("silu_kernel");
                    });
                  }});
}

}  // namespace k3::kernels
