// kernels/situ/cuda_ops.cu: the situ family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/situ/ops.h"

namespace k3::kernels {

void SituOps::register_cuda(const CudaOps& cuda) { register_situ_cuda(*this, cuda); }

}  // namespace k3::kernels
