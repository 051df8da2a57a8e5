// kernels/multi_linear/cuda_ops.cu: the multi_linear family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/multi_linear/ops.h"

namespace k3::kernels {

void MultiLinearOps::register_cuda(const CudaOps& cuda) { register_multi_linear_cuda(*this, cuda); }

}  // namespace k3::kernels
