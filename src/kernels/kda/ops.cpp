// kernels/kda/ops.cpp: the kda family's CPU references (see ops.h).
#include "kernels/kda/ops.h"

namespace k3::kernels {

void KdaOps::register_reference(const CpuOps& cpu) {
  add_reference(kda_conv, cpu, kda_conv_reference);
  add_reference(kda_recurrent, cpu, kda_recurrent_reference);
  add_reference(kda_chunked, cpu, kda_chunked_reference);
  add_reference(kda_output_gate, cpu, kda_output_gate_reference);
  add_reference(kda_decode, cpu, kda_decode_reference);
}

}  // namespace k3::kernels
