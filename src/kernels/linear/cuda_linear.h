// kernels/linear/cuda_linear.h: the CUDA linear's cuBLASLt route as functions, for fused ops that
// run several linears (kernels/multi_linear at more rows than its one-launch kernel pays for).
// CUDA builds only (kernels/op_table.h's CudaOps).
#pragma once
#include "kernels/linear/linear.h"
#include "kernels/op_table.h"

namespace k3::kernels {

// What the "cuda_cublaslt" linear implementation accepts (bf16 x bf16 or f32 x f32 GEMMs that
// cuBLASLt has an algorithm for), and its run.
core::Status linear_cublaslt_supports(const CudaOps& ops, const LinearArgs& a);
void linear_cublaslt_run(const CudaOps& ops, const LinearArgs& a);

}  // namespace k3::kernels
