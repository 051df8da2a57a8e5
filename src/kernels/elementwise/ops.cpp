// kernels/elementwise/ops.cpp: the elementwise family's CPU references (see ops.h).
#include "kernels/elementwise/ops.h"

namespace k3::kernels {

void ElementwiseOps::register_reference(const CpuOps& cpu) {
  add_reference(add, cpu, add_reference);
  add_reference(sigmoid_gate, cpu, sigmoid_gate_reference);
  add_reference(to_activation, cpu, to_activation_reference);
}

}  // namespace k3::kernels
