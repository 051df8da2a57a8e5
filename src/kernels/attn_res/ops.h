// kernels/attn_res/ops.h: the op tables of one family, Block Attention Residuals: the mix of the
// standard path, the fused bank and merge of the decode path.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/attn_res/attn_res_fused.h"
#include "kernels/attn_res/mix.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct AttnResOps {
  OpTable<AttnResMixArgs> attn_res_mix{"attn_res_mix", attn_res_mix_check};
  OpTable<AttnResBankArgs> attn_res_bank{"attn_res_bank", attn_res_bank_check};
  OpTable<AttnResMergeArgs> attn_res_merge{
      "attn_res_merge", attn_res_merge_check, {"rows", [](const AttnResMergeArgs& a) { return a.prefix.dim(0); }}};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(attn_res_mix);
    fn(attn_res_bank);
    fn(attn_res_merge);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_attn_res_cuda(AttnResOps& r, const CudaOps& ops);
void register_attn_res_fused_cuda(AttnResOps& r, const CudaOps& ops);

}  // namespace k3::kernels
