// kernels/gqa/ops.cpp: the gqa family's CPU references (see ops.h).
#include "kernels/gqa/ops.h"

namespace k3::kernels {

void GqaOps::register_reference(const CpuOps& cpu) {
  add_reference(rope_gqa_attention, cpu, rope_gqa_attention_reference);
}

}  // namespace k3::kernels
