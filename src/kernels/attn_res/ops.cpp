// kernels/attn_res/ops.cpp: the attn_res family's CPU references (see ops.h).
#include "kernels/attn_res/ops.h"

namespace k3::kernels {

void AttnResOps::register_reference(const CpuOps& cpu) {
  add_reference(attn_res_mix, cpu, attn_res_mix_reference);
  add_reference(attn_res_bank, cpu, attn_res_bank_reference);
  add_reference(attn_res_merge, cpu, attn_res_merge_reference);
}

}  // namespace k3::kernels
