// kernels/moe/ops.h: the op tables of one family, Stable LatentMoE: the router, the routed experts
// and the fused tail.
// kernels/registry.h's Registry holds one of each family. Adding an op or an implementation of
// the family touches this folder only: its table here, its CPU reference in ops.cpp, its CUDA
// registration in cuda_ops.cu, its tuning rule (if it has rivals) in tuning/*.json.
#pragma once
#include "kernels/moe/experts.h"
#include "kernels/moe/moe_tail.h"
#include "kernels/moe/router.h"
#include "kernels/op_table.h"

namespace k3::kernels {

struct MoeOps {
  OpTable<RouterTopkArgs> router_topk{
      "router_topk", router_topk_check, {"tokens", [](const RouterTopkArgs& a) { return a.logits.dim(0); }}};
  OpTable<MoeExpertsArgs> moe_experts{
      "moe_experts", moe_experts_check, {"tokens", [](const MoeExpertsArgs& a) { return a.z.dim(0); }}};
  OpTable<MoeTailCombineArgs> moe_tail_combine{
      "moe_tail_combine", moe_tail_combine_check, {"rows", [](const MoeTailCombineArgs& a) { return a.u.dim(0); }}};

  // Calls fn(table) for every op table of the family.
  template <class Fn>
  void for_each(Fn&& fn) {
    fn(router_topk);
    fn(moe_experts);
    fn(moe_tail_combine);
  }
  // The CPU reference of every op (ops.cpp).
  void register_reference(const CpuOps& cpu);
  // Every CUDA implementation, in the order that breaks ties the tuning tables leave
  // (cuda_ops.cu; CUDA builds only).
  void register_cuda(const CudaOps& cuda);
};

// One registration function per CUDA source of the folder (cuda_*.cu).
void register_router_cuda(MoeOps& r, const CudaOps& ops);
void register_moe_experts_cuda(MoeOps& r, const CudaOps& ops);
void register_moe_experts_gemv_cuda(MoeOps& r, const CudaOps& ops);
void register_moe_experts_grouped_cuda(MoeOps& r, const CudaOps& ops);
void register_moe_tail_combine_cuda(MoeOps& r, const CudaOps& ops);

}  // namespace k3::kernels
