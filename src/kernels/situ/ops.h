// kernels/situ/ops.h: the op tables of one family, the gated activations (SiTU-GLU, SiLU-GLU).
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/op_table.h"
#include "kernels/situ/situ_glu.h"

namespace k3::kernels {

struct SituOps {
  OpTable<SituGluArgs> situ_glu{"situ_glu", situ_glu_check};
  OpTable<SiluGluArgs> silu_glu{"silu_glu", silu_glu_check};  // the EAGLE-3 draft's MLP

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(situ_glu);
    fn(silu_glu);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_situ_cuda(SituOps& r, const CudaOps& ops);

}  // namespace k3::kernels
