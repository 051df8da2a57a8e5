// kernels/gqa/cuda_ops.cu: the gqa family's CUDA implementations.
#include "kernels/gqa/ops.h"

namespace k3::kernels {

void GqaOps::register_cuda(const CudaOps& cuda) { register_gqa_cuda(*this, cuda); }

}  // namespace k3::kernels
