// kernels/dspark/ops.cpp: the dspark family's CPU references (see ops.h).
#include "kernels/dspark/ops.h"

namespace k3::kernels {

void DsparkOps::register_reference(const CpuOps& cpu) {
  add_reference(rope_pairs, cpu, rope_pairs_reference);
  add_reference(mla_block_attention, cpu, mla_block_attention_reference);
  add_reference(markov_draft, cpu, markov_draft_reference);
}

}  // namespace k3::kernels
