// kernels/linear/cuda.cu: CUDA linear y = x W^T (spec §2 "Linear"): cuBLASLt for bf16 x bf16 (and
// f32 x f32) GEMMs, and the CUDA-core row-dot kernel for everything else (f32 activations with
// bf16 weights, MXFP4 weights, layouts cuBLASLt has no algorithm for).
//
// Both accumulate in fp32 and round once on output (bf16 y, or f32 y in Precision::bf16 with
// round_output); the summation order differs from the reference's sequential one (tolerance).
#include "backends/cuda/blas_lt.h"
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_rowdot.cuh"
#include "kernels/linear/cuda_linear.h"
#include "kernels/linear/linear.h"
#include "kernels/linear/ops.h"

namespace k3::kernels {

using namespace cuda_detail;

namespace {

core::Status common_supports(const CudaOps& ops, const LinearArgs& a) {
  if (auto s = ops.usable(); !s) return s;
  if (auto s = on_cuda({{"x", &a.x}, {"out", &a.out}}); !s) return s;
  if (auto s = weight_on_cuda(*a.w, "w"); !s) return s;
  if (a.x.dtype != core::DType::bf16 && a.x.dtype != core::DType::f32)
    return core::Status::fail("x must be bf16 or f32, got " + describe(a.x));
  if (a.x.dtype == core::DType::bf16 && a.precision != Precision::bf16)
    return core::Status::fail("bf16 activations need Precision::bf16");
  if (a.out.dtype == core::DType::bf16 && !a.round_output)
    return core::Status::fail("round_output = false (logits) needs an f32 out, got " + describe(a.out));
  return core::Status::ok();
}

backends::cuda::GemmArgs gemm_args(const LinearArgs& a) {
  backends::cuda::GemmArgs g;
  g.tokens = a.x.dim(0);
  g.in = a.w->in_features();
  g.out = a.w->out_features();
  g.x = a.x.data;
  g.x_ld = a.x.dim(0) > 1 ? a.x.strides[0] : g.in;
  g.w = a.w->weight.view().data;
  g.w_ld = a.w->weight.view().strides[0];
  g.y = a.out.data;
  g.y_ld = a.out.dim(0) > 1 ? a.out.strides[0] : g.out;
  g.in_type = a.x.dtype == core::DType::bf16 ? backends::cuda::GemmType::bf16 : backends::cuda::GemmType::f32;
  g.out_type = a.out.dtype == core::DType::bf16 ? backends::cuda::GemmType::bf16 : backends::cuda::GemmType::f32;
  return g;
}

core::Status cublaslt_supports(const CudaOps& ops, const LinearArgs& a) {
  if (auto s = common_supports(ops, a); !s) return s;
  if (a.w->is_mxfp4()) return core::Status::fail("MXFP4 weights are decoded by cuda_rowdot");
  if (a.w->weight.dtype() != a.x.dtype)
    return core::Status::fail("cuBLASLt needs x and W of one dtype, got x " + describe(a.x) + ", W " +
                              describe(a.w->weight.view()));
  if (a.x.dtype == core::DType::f32 &&
      (a.out.dtype != core::DType::f32 || (a.round_output && a.precision == Precision::bf16)))
    return core::Status::fail("f32 GEMMs write unrounded f32 (Precision::fp32 or logits only)");
  if (a.x.dtype == core::DType::bf16 && a.out.dtype == core::DType::f32 && a.round_output)
    return core::Status::fail("bf16 GEMMs round only into a bf16 out; got f32 out with round_output");
  if (a.x.dim(0) == 0 || a.w->out_features() == 0) return core::Status::ok();
  if (!ops.ctx->blas().supports(gemm_args(a)))
    return core::Status::fail("cuBLASLt has no algorithm for this shape/layout/alignment");
  return core::Status::ok();
}

void cublaslt_run(const CudaOps& ops, const LinearArgs& a) {
  if (a.x.dim(0) == 0 || a.w->out_features() == 0) return;
  ops.ctx->blas().gemm(gemm_args(a), ops.ctx->stream());
}

void rowdot_run(const CudaOps& ops, const LinearArgs& a) {
  const int64_t T = a.x.dim(0), in = a.w->in_features(), out = a.w->out_features();
  const bool round = a.round_output && a.precision == Precision::bf16;
  const int64_t x_ld = T > 1 ? a.x.strides[0] : in, y_ld = T > 1 ? a.out.strides[0] : out;
  with_act(a.x.dtype, [&](auto xt) {
    using XT = typename decltype(xt)::type;
    with_act(a.out.dtype, [&](auto yt) {
      using YT = typename decltype(yt)::type;
      launch_linear_rowdot<XT, YT>(weight_format(*a.w), weight_ref(*a.w), out, in, a.x.as<const XT>(), x_ld,
                                   a.out.as<YT>(), y_ld, T, round, ops.ctx->stream());
    });
  });
}

}  // namespace

core::Status linear_cublaslt_supports(const CudaOps& ops, const LinearArgs& a) { return cublaslt_supports(ops, a); }
void linear_cublaslt_run(const CudaOps& ops, const LinearArgs& a) { cublaslt_run(ops, a); }

void register_linear_cuda(LinearOps& r, const CudaOps& ops) {
  r.linear.add({"cuda_cublaslt", core::Device::cuda, [ops](const LinearArgs& a) { return cublaslt_supports(ops, a); },
                [ops](const LinearArgs& a) { cublaslt_run(ops, a); }});
  r.linear.add({"cuda_rowdot", core::Device::cuda, [ops](const LinearArgs& a) { return common_supports(ops, a); },
                [ops](const LinearArgs& a) { rowdot_run(ops, a); }});
}

}  // namespace k3::kernels
