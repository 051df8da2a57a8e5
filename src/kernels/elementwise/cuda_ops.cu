// kernels/elementwise/cuda_ops.cu: the elementwise family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/elementwise/ops.h"

namespace k3::kernels {

void ElementwiseOps::register_cuda(const CudaOps& cuda) { register_elementwise_cuda(*this, cuda); }

}  // namespace k3::kernels
