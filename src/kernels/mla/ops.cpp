// kernels/mla/ops.cpp: the mla family's CPU references (see ops.h).
#include "kernels/mla/ops.h"

namespace k3::kernels {

void MlaOps::register_reference(const CpuOps& cpu) {
  add_reference(mla_cache_write, cpu, mla_cache_write_reference);
  add_reference(mla_naive, cpu, mla_naive_reference);
  add_reference(mla_absorbed, cpu, mla_absorbed_reference);
  add_reference(mla_q_absorb, cpu, mla_q_absorb_reference);
  add_reference(mla_partial_attention, cpu, mla_partial_attention_reference);
  add_reference(mla_lse_rescale, cpu, mla_lse_rescale_reference);
  add_reference(mla_w_uv, cpu, mla_w_uv_reference);
  add_reference(mla_cache_gather, cpu, mla_cache_gather_reference);
  add_reference(mla_prep, cpu, mla_prep_reference);
  add_reference(mla_decode, cpu, mla_decode_reference);
}

}  // namespace k3::kernels
