// kernels/norm/ops.cpp: the norm family's CPU references (see ops.h).
#include "kernels/norm/ops.h"

namespace k3::kernels {

void NormOps::register_reference(const CpuOps& cpu) { add_reference(rmsnorm, cpu, rmsnorm_reference); }

}  // namespace k3::kernels
