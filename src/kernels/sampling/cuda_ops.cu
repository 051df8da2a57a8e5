// kernels/sampling/cuda_ops.cu: the sampling family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/sampling/ops.h"

namespace k3::kernels {

void SamplingOps::register_cuda(const CudaOps& cuda) { register_sampling_cuda(*this, cuda); }

}  // namespace k3::kernels
