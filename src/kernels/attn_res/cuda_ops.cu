// kernels/attn_res/cuda_ops.cu: the attn_res family's CUDA implementations, registered in the order that
// breaks the ties the tuning tables leave (see ops.h).
#include "kernels/attn_res/ops.h"

namespace k3::kernels {

void AttnResOps::register_cuda(const CudaOps& cuda) {
  register_attn_res_cuda(*this, cuda);
  register_attn_res_fused_cuda(*this, cuda);
}

}  // namespace k3::kernels
