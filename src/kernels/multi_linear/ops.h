// kernels/multi_linear/ops.h: the op tables of one family, several linears over one input in one
// call, with the router epilogue (fused decode path).
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/multi_linear/multi_linear.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct MultiLinearOps {
  OpTable<MultiLinearArgs> multi_linear{
      "multi_linear", multi_linear_check, {"rows", [](const MultiLinearArgs& a) { return a.x.dim(0); }}};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(multi_linear);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_multi_linear_cuda(MultiLinearOps& r, const CudaOps& ops);

}  // namespace k3::kernels
