// kernels/linear/cuda_ops.cu: the linear family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/linear/ops.h"

namespace k3::kernels {

void LinearOps::register_cuda(const CudaOps& cuda) { register_linear_cuda(*this, cuda); }

}  // namespace k3::kernels
