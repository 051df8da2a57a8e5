// kernels/norm/cuda_ops.cu: the norm family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/norm/ops.h"

namespace k3::kernels {

void NormOps::register_cuda(const CudaOps& cuda) { register_rmsnorm_cuda(*this, cuda); }

}  // namespace k3::kernels
