// kernels/multi_linear/ops.cpp: the multi_linear family's CPU references (see ops.h).
#include "kernels/multi_linear/ops.h"

namespace k3::kernels {

void MultiLinearOps::register_reference(const CpuOps& cpu) { add_reference(multi_linear, cpu, multi_linear_reference); }

}  // namespace k3::kernels
