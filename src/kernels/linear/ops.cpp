// kernels/linear/ops.cpp: the linear family's CPU references (see ops.h).
#include "kernels/linear/ops.h"

namespace k3::kernels {

void LinearOps::register_reference(const CpuOps& cpu) { add_reference(linear, cpu, linear_reference); }

}  // namespace k3::kernels
