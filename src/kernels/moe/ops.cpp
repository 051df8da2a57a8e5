// kernels/moe/ops.cpp: the moe family's CPU references (see ops.h).
#include "kernels/moe/ops.h"

namespace k3::kernels {

void MoeOps::register_reference(const CpuOps& cpu) {
  add_reference(router_topk, cpu, router_topk_reference);
  add_reference(moe_experts, cpu, moe_experts_reference);
  add_reference(moe_tail_combine, cpu, moe_tail_combine_reference);
}

}  // namespace k3::kernels
