// kernels/sampling/ops.cpp: the sampling family's CPU references (see ops.h).
#include "kernels/sampling/ops.h"

namespace k3::kernels {

void SamplingOps::register_reference(const CpuOps& cpu) {
  add_reference(sample, cpu, sample_reference);
  add_reference(token_mask, cpu, token_mask_reference);
}

}  // namespace k3::kernels
