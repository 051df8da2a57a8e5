// kernels/dspark/cuda_ops.cu: the dspark family's CUDA implementations.
#include "kernels/dspark/ops.h"

namespace k3::kernels {

void DsparkOps::register_cuda(const CudaOps& cuda) { register_dspark_cuda(*this, cuda); }

}  // namespace k3::kernels
