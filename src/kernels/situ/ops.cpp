// kernels/situ/ops.cpp: the situ family's CPU references (see ops.h).
#include "kernels/situ/ops.h"

namespace k3::kernels {

void SituOps::register_reference(const CpuOps& cpu) {
  add_reference(situ_glu, cpu, situ_glu_reference);
  add_reference(silu_glu, cpu, silu_glu_reference);
}

}  // namespace k3::kernels
