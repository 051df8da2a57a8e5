// kernels/elementwise/cuda.cu: CUDA residual add and MLA sigmoid output gate (spec §3, §6.1), one
// thread per element over contiguous tensors (the check requires contiguity).
//   add:          out = round(a + b)
//   sigmoid_gate: out = round(x * round(sigmoid(g)))   (the gate is stored as bf16 first)
//   to_activation: out = round(x), x f32 with strided rows (a TP all-reduce sum, spec §11)
#include "kernels/cuda_common.cuh"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n, bool round) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_act(out + i, to_f32(a[i]) + to_f32(b[i]), round);
}

template <class T>
__global__ void sigmoid_gate_kernel(const T* x, const T* g, T* out, int64_t n, bool round) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) store_act(out + i, to_f32(x[i]) * round_if(sigmoid_f32(to_f32(g[i])), round), round);
}

// One thread per element of [T, D]; x f32 and out with row strides x_ld / out_ld.
template <class T>
__global__ void to_activation_kernel(const float* x, int64_t x_ld, T* out, int64_t out_ld, int64_t rows, int64_t cols,
                                     bool round) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, c = i % cols;
  store_act(out + r * out_ld + c, x[r * x_ld + c], round);
}

core::Status supports3(const CudaOps& ops, const char* an, const core::TensorView& a, const char* bn,
                       const core::TensorView& b, const core::TensorView& out, Precision p) {
  return all_of(
      {ops.usable(), on_cuda({{an, &a}, {bn, &b}, {"out", &out}}), same_act({{an, &a}, {bn, &b}, {"out", &out}}, p)});
}

}  // namespace

void register_elementwise_cuda(ElementwiseOps& r, const CudaOps& ops) {
  r.add.add({"cuda_elementwise", core::Device::cuda,
             [ops](const AddArgs& a) { return supports3(ops, "a", a.a, "b", a.b, a.out, a.precision); },
             [ops](const AddArgs& a) {
               const int64_t n = a.out.numel();
               if (n == 0) return;
               with_act(a.out.dtype, [&](auto tag) {
                 using T = typename decltype(tag)::type;
                 add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, ops.ctx->stream()>>>(
                     a.a.as<const T>(), a.b.as<const T>(), a.out.as<T>(), n, a.precision == Precision::bf16);
                 K3_CUDA_CHECK_LAUNCH("add_kernel");
               });
             }});
  r.to_activation.add({"cuda_elementwise", core::Device::cuda,
                       [ops](const ToActivationArgs& a) {
                         return all_of({ops.usable(), on_cuda({{"x", &a.x}, {"out", &a.out}}),
                                        same_act({{"out", &a.out}}, a.precision)});
                       },
                       [ops](const ToActivationArgs& a) {
                         const int64_t rows = a.x.dim(0), cols = a.x.dim(1), n = rows * cols;
                         if (n == 0) return;
                         with_act(a.out.dtype, [&](auto tag) {
                           using T = typename decltype(tag)::type;
                           to_activation_kernel<T><<<grid_for(n, kThreads), kThreads, 0, ops.ctx->stream()>>>(
                               a.x.as<const float>(), a.x.strides[0], a.out.as<T>(), a.out.strides[0], rows, cols,
                               a.precision == Precision::bf16);
                           K3_CUDA_CHECK_LAUNCH("to_activation_kernel");
                         });
                       }});
  r.sigmoid_gate.add(
      {"cuda_elementwise", core::Device::cuda,
       [ops](const SigmoidGateArgs& a) { return supports3(ops, "x", a.x, "gate", a.gate, a.out, a.precision); },
       [ops](const SigmoidGateArgs& a) {
         const int64_t n = a.out.numel();
         if (n == 0) return;
         with_act(a.out.dtype, [&](auto tag) {
           using T = typename decltype(tag)::type;
           sigmoid_gate_kernel<T><<<grid_for(n, kThreads), kThreads, 0, ops.ctx->stream()>>>(
               a.x.as<const T>(), a.gate.as<const T>(), a.out.as<T>(), n, a.precision == Precision::bf16);
           K3_CUDA_CHECK_LAUNCH("sigmoid_gate_kernel");
         });
       }});
}

}  // namespace k3::kernels
