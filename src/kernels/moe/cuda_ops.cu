// kernels/moe/cuda_ops.cu: the moe family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/moe/ops.h"

namespace k3::kernels {

void MoeOps::register_cuda(const CudaOps& cuda) {
  register_router_cuda(*this, cuda);
  register_moe_experts_cuda(*this, cuda);
  register_moe_experts_gemv_cuda(*this, cuda);
  register_moe_experts_grouped_cuda(*this, cuda);
  register_moe_tail_combine_cuda(*this, cuda);
}

}  // namespace k3::kernels
