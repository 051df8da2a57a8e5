// kernels/gqa/ops.h: the op tables of one family, grouped-query attention (the EAGLE-3 draft's).
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/gqa/gqa.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct GqaOps {
  OpTable<RopeGqaAttentionArgs> rope_gqa_attention{"rope_gqa_attention", rope_gqa_attention_check};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(rope_gqa_attention);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_gqa_cuda(GqaOps& r, const CudaOps& ops);

}  // namespace k3::kernels
